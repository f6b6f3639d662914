"""The generation fields both endpoints take: sampling, stopping and structured output.

Part of the translation (gateway/openai/translate.py): each reads its fields through `Fields`
into the dpgate.v1 messages Generate and Chat share (SamplingParams, StoppingCriteria,
StructuredOutput), so a field means the same on /v1/completions as on /v1/chat/completions.
"""

from __future__ import annotations

import json
from typing import Any, Final

from dpgate.json_text import json_type_name
from dpgate.v1 import generate_pb2
from gateway.openai.errors import RequestError
from gateway.openai.fields import Fields

MAX_SEED: Final = 2**64 - 1


def is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**32


def sampling_fields(fields: Fields, sampling: generate_pb2.SamplingParams) -> None:
    temperature = fields.take_float("temperature")
    if temperature is not None:
        sampling.temperature = temperature
    top_p = fields.take_float("top_p")
    if top_p is not None:
        sampling.top_p = top_p
    top_k = fields.take_int("top_k")
    if top_k is not None:
        if top_k == -1:  # vLLM's spelling of "no limit"
            top_k = 0
        sampling.top_k = top_k
    min_p = fields.take_float("min_p")
    if min_p is not None:
        sampling.min_p = min_p
    seed = fields.take_int("seed", 0, MAX_SEED)
    if seed is not None:
        sampling.seed = seed
    for key in ("presence_penalty", "frequency_penalty"):
        value = fields.take_float(key)
        if value is not None:
            setattr(sampling, key, value)
    repetition = fields.take_float("repetition_penalty")
    if repetition is not None:
        sampling.repetition_penalty = repetition
    for key, bias in (fields.take_dict("logit_bias") or {}).items():
        name = f"logit_bias[{key!r}]"
        if not key.isascii() or not key.isdigit() or int(key) >= 2**32:
            raise RequestError(f"logit_bias keys must be token ids (decimal integers), not {key!r}", "logit_bias")
        if isinstance(bias, bool) or not isinstance(bias, int | float):
            raise RequestError(f"{name} must be a number, not {json_type_name(bias)}", "logit_bias")
        sampling.logit_bias[int(key)] = float(bias)


def stopping_fields(fields: Fields, stopping: generate_pb2.StoppingCriteria, max_tokens_keys: tuple[str, ...]) -> None:
    given = [(key, fields.take_int(key)) for key in max_tokens_keys]
    values = [(key, value) for key, value in given if value is not None]
    if len({value for _, value in values}) > 1:
        raise RequestError(f"{values[0][0]} and {values[1][0]} disagree: give one", values[1][0])
    if values:
        stopping.max_tokens = values[0][1]
    min_tokens = fields.take_int("min_tokens", 0)
    if min_tokens is not None:
        stopping.min_tokens = min_tokens
    stop = fields.take("stop")
    if isinstance(stop, str):
        stopping.stop.append(stop)
    elif isinstance(stop, list) and all(isinstance(item, str) for item in stop):
        stopping.stop.extend(stop)
    elif stop is not None:
        raise RequestError("stop must be a string or an array of strings", "stop")
    for index, token in enumerate(fields.take_list("stop_token_ids") or []):
        if not is_token_id(token):
            raise RequestError(f"stop_token_ids[{index}] must be a token id", "stop_token_ids")
        stopping.stop_token_ids.append(token)
    ignore_eos = fields.take_bool("ignore_eos")
    if ignore_eos:
        stopping.ignore_eos = True


def structured_output_fields(fields: Fields, request: Any) -> None:
    """response_format, or one of vLLM's names: guided_json/regex/choice/grammar, structured_outputs."""
    chosen: list[tuple[str, generate_pb2.StructuredOutput]] = []
    response_format = fields.take_object("response_format")
    if response_format is not None:
        output = _response_format(response_format)
        if output is not None:
            chosen.append(("response_format", output))
    chosen.extend(_guided_kinds(fields, key="guided_{}", name="guided_{}"))
    structured = fields.take_object("structured_outputs")
    if structured is not None:
        chosen.extend(_structured_outputs(structured))
    if len(chosen) > 1:
        raise RequestError(f"{chosen[0][0]} and {chosen[1][0]} cannot be given together: give one format", chosen[1][0])
    if chosen:
        request.structured_output.CopyFrom(chosen[0][1])


def _response_format(fields: Fields) -> generate_pb2.StructuredOutput | None:
    kind = fields.take_str("type")
    if kind == "text":
        fields.refuse_rest()
        return None
    if kind == "json_object":
        fields.refuse_rest()
        return generate_pb2.StructuredOutput(json_object=generate_pb2.JsonObject())
    if kind != "json_schema":
        raise RequestError(
            f"response_format.type must be text, json_object or json_schema, not {kind!r}", "response_format.type"
        )
    spec = fields.take_object("json_schema")
    if spec is None:
        name = "response_format.json_schema"
        raise RequestError(f"{name} is required for type json_schema", name)
    spec.take_str("name")
    spec.take_str("description")
    # strict false asks for best effort; the grammar always gives the exact schema, which meets both.
    spec.take_bool("strict")
    schema = spec.take_dict("schema")
    spec.refuse_rest()
    fields.refuse_rest()
    return _json_schema_output(schema if schema is not None else {}, "response_format.json_schema.schema")


def _structured_outputs(fields: Fields) -> list[tuple[str, generate_pb2.StructuredOutput]]:
    chosen = _guided_kinds(fields, key="{}", name="structured_outputs.{}")
    if fields.take_bool("json_object"):
        json_object = generate_pb2.StructuredOutput(json_object=generate_pb2.JsonObject())
        chosen.append(("structured_outputs.json_object", json_object))
    fields.refuse_rest()
    return chosen


def _guided_kinds(fields: Fields, key: str, name: str) -> list[tuple[str, generate_pb2.StructuredOutput]]:
    """The four structured-output kinds vLLM takes under two spellings (`guided_json` ...,
    `structured_outputs.json` ...): `key` and `name` are the field's key and reported name with `{}`
    for the kind; in the order json, regex, choice, grammar, each one given as (name, output)."""
    chosen = []
    value = fields.take(key.format("json"))
    if value is not None:
        chosen.append((name.format("json"), _json_schema_output(value, name.format("json"))))
    regex = fields.take_str(key.format("regex"))
    if regex is not None:
        chosen.append((name.format("regex"), generate_pb2.StructuredOutput(regex=regex)))
    choice = fields.take_list(key.format("choice"))
    if choice is not None:
        chosen.append((name.format("choice"), _choice_output(choice, name.format("choice"))))
    grammar = fields.take_str(key.format("grammar"))
    if grammar is not None:
        chosen.append((name.format("grammar"), generate_pb2.StructuredOutput(ebnf=grammar)))
    return chosen


def _json_schema_output(value: Any, name: str) -> generate_pb2.StructuredOutput:
    if isinstance(value, str):
        return generate_pb2.StructuredOutput(json_schema=value)
    if isinstance(value, dict | bool):
        return generate_pb2.StructuredOutput(json_schema=json.dumps(value))
    raise RequestError(f"{name} must be a JSON schema (an object or its JSON text), not {json_type_name(value)}", name)


def _choice_output(value: list[Any], name: str) -> generate_pb2.StructuredOutput:
    if not value or not all(isinstance(item, str) for item in value):
        raise RequestError(f"{name} must be a non-empty array of strings", name)
    return generate_pb2.StructuredOutput(choice=generate_pb2.ChoiceList(choices=value))
