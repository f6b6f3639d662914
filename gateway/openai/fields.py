"""Typed reads of a JSON request body, each refusal naming the field and the rule.

`Fields` wraps one JSON object. Each `take_*` reads a key (null counts as absent, as OpenAI's
clients send explicit nulls for unset options) and checks its type; `refuse_rest` ends the
reading: any key not taken is a field this server does not support, and a 400 names it. So no
field is ever silently ignored.
"""

from __future__ import annotations

import math
from typing import Any

from dpgate.json_text import json_type_name
from gateway.openai.errors import RequestError


class Fields:
    """The keys of one JSON object, read once each; `prefix` is the object's path (`messages[0].`)."""

    __slots__ = ("_body", "_prefix", "_taken")

    def __init__(self, body: Any, prefix: str = "", what: str = "the request body") -> None:
        if not isinstance(body, dict):
            raise RequestError(f"{what} must be a JSON object, not {json_type_name(body)}", prefix.rstrip(".") or None)
        self._body = body
        self._prefix = prefix
        self._taken: set[str] = set()

    def name(self, key: str) -> str:
        return f"{self._prefix}{key}"

    def has(self, key: str) -> bool:
        return self._body.get(key) is not None

    def take(self, key: str) -> Any:
        self._taken.add(key)
        return self._body.get(key)

    def take_str(self, key: str) -> str | None:
        value = self.take(key)
        if value is not None and not isinstance(value, str):
            raise RequestError(f"{self.name(key)} must be a string, not {json_type_name(value)}", self.name(key))
        return value

    def take_bool(self, key: str) -> bool | None:
        value = self.take(key)
        if value is not None and not isinstance(value, bool):
            raise RequestError(f"{self.name(key)} must be true or false, not {json_type_name(value)}", self.name(key))
        return value

    def take_int(self, key: str, minimum: int | None = None, maximum: int | None = None) -> int | None:
        value = self.take(key)
        if value is None:
            return None
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise RequestError(f"{self.name(key)} must be an integer, not {json_type_name(value)}", self.name(key))
        self._check_range(key, value, minimum, maximum)
        return value

    def take_float(self, key: str, minimum: float | None = None, maximum: float | None = None) -> float | None:
        value = self.take(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise RequestError(f"{self.name(key)} must be a finite number, not {json_type_name(value)}", self.name(key))
        self._check_range(key, value, minimum, maximum)
        return float(value)

    def take_list(self, key: str) -> list[Any] | None:
        value = self.take(key)
        if value is not None and not isinstance(value, list):
            raise RequestError(f"{self.name(key)} must be an array, not {json_type_name(value)}", self.name(key))
        return value

    def take_object(self, key: str) -> Fields | None:
        value = self.take(key)
        if value is None:
            return None
        return Fields(value, f"{self.name(key)}.", self.name(key))

    def take_dict(self, key: str) -> dict[str, Any] | None:
        value = self.take(key)
        if value is not None and not isinstance(value, dict):
            raise RequestError(f"{self.name(key)} must be a JSON object, not {json_type_name(value)}", self.name(key))
        return value

    def refuse_rest(self) -> None:
        """Every key not taken (and not null) is an unsupported field: a 400 naming the first."""
        for key, value in self._body.items():
            if key not in self._taken and value is not None:
                raise RequestError(f"{self.name(key)} is not supported by this server", self.name(key))

    def _check_range(self, key: str, value: float, minimum: float | None, maximum: float | None) -> None:
        if minimum is not None and value < minimum:
            raise RequestError(f"{self.name(key)} must be at least {minimum}, not {value}", self.name(key))
        if maximum is not None and value > maximum:
            raise RequestError(f"{self.name(key)} must be at most {maximum}, not {value}", self.name(key))
