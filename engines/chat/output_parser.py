r"""Splits a chat model's output into content, reasoning and tool calls, incrementally.

The same `ChatOutputParser` serves streaming (fed each detokenized delta) and unary answers
(`parse_all` feeds the whole text at once), so both give the same pieces by construction.

States and markers (reasoning markers only with `parse_reasoning`, tool-call markers only with
`parse_tools`; an inactive marker is plain text):
- reasoning: where a thinking request starts (the template opened `<think>` in the prompt, or the
  model will). `</think>` ends it. A `<think>` here (the model opening its reasoning itself, or a
  stray one) and a stray `</tool_call>` are dropped. A `<tool_call>` ends the reasoning too: a model
  that forgets `</think>` before calling still calls.
- content: where a request that does not think starts. `<tool_call>` opens a call; `<think>` opens
  reasoning (the model reasons although it was not asked to: its words are reasoning, not answer);
  a stray `</think>` or `</tool_call>` is dropped.
- tool call: everything up to `</tool_call>` is the call's body, no other marker counts inside (a
  JSON string may hold `<think>`). The body must be JSON `{"name": str, "arguments": object}`;
  "arguments" may be a JSON string holding an object, "parameters" is accepted for "arguments", and
  missing or null arguments mean `{}` (Hermes and Qwen variants write all of these). Anything else,
  and a call still open at `finish`, is dropped and counted (`num_dropped_calls`): raw tool-call
  markup never reaches content, where an OpenAI client would show it to its user as the answer.
Whitespace around markup: reasoning is trimmed at both ends (Qwen writes `<think>\n...\n</think>`);
content loses the whitespace right after a marker (`</think>\n\n`, the newline after `</tool_call>`)
and whitespace-only content before the first marker, so `</think>\n<tool_call>` leaves no content
and whitespace-only content between tool calls is dropped. All other text is kept exactly, the
spaces before a `<tool_call>` included, and so is whitespace that no marker follows.

Holding back: `feed` emits all it can and keeps only a suffix that is a proper prefix of an active
marker (it might become one), whitespace that a marker might still follow (trailing whitespace of
reasoning, leading whitespace of the output's content), and an open tool call's body. No marker
is a substring of another (`ChatMarkers` checks), so the first complete marker in the buffer is the
right one whatever the chunking.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from engines.chat.markers import ChatMarkers, ChatParsing

DEFAULT_MARKERS = ChatMarkers()
PieceKind = Literal["content", "reasoning", "tool_call"]


@dataclass(frozen=True, slots=True)
class ParsedToolCall:
    id: str
    name: str
    arguments: str  # compact JSON of an object


@dataclass(frozen=True, slots=True)
class ChatPiece:
    kind: PieceKind
    text: str = ""
    tool_call: ParsedToolCall | None = None


@dataclass(slots=True)
class ParsedChat:
    """A whole answer: "" where there is no content or no reasoning."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[ParsedToolCall] = field(default_factory=list)


class _State(enum.Enum):
    REASONING = "reasoning"
    CONTENT = "content"
    TOOL_CALL = "tool_call"


class ChatOutputParser:
    """One per request. `request_id` makes the tool-call ids (`call_<request-id-prefix>_<n>`, n from 0)."""

    def __init__(
        self,
        thinking: bool,
        markers: ChatMarkers = DEFAULT_MARKERS,
        parse_tools: bool = True,
        *,
        parse_reasoning: bool = True,
        request_id: str = "",
    ):
        self.markers = markers
        self.parse_tools = parse_tools
        self.parse_reasoning = parse_reasoning
        self.state = _State.REASONING if thinking and parse_reasoning else _State.CONTENT
        self._id_prefix = f"call_{request_id[:16]}_" if request_id else "call_"
        self._num_tool_calls = 0
        self.num_dropped_calls = 0  # tool calls that did not parse or never closed: not returned at all
        self._pending = ""  # text not yet looked at for markers (at most a marker's proper prefix between feeds)
        self._held_space = ""  # whitespace not yet emitted: dropped if a marker follows, emitted otherwise
        self._holds_leading = self.state is _State.CONTENT  # the output's content is whitespace so far
        self._after_marker = self.state is _State.REASONING  # leading whitespace here is dropped
        self._body = ""  # an open tool call's text after its start marker
        self._body_scanned = 0  # how far `_body` has been searched for the end marker
        self._finished = False
        self._out: list[ChatPiece] = []
        self._markers_by_state = {state: self._active_markers(state) for state in _State}

    @classmethod
    def for_parsing(cls, parsing: ChatParsing, thinking: bool, request_id: str = "") -> ChatOutputParser:
        return cls(
            thinking,
            parsing.markers,
            parsing.parse_tools,
            parse_reasoning=parsing.parse_reasoning,
            request_id=request_id,
        )

    @property
    def starts_in_reasoning(self) -> bool:
        """Before any feed: whether the first text is taken as reasoning."""
        return self.state is _State.REASONING

    def feed(self, text: str) -> list[ChatPiece]:
        """The pieces `text` completes, adjacent pieces of one kind merged."""
        if self._finished:
            raise RuntimeError("feed after finish")
        self._pending += text
        self._scan()
        return self._take()

    def finish(self) -> list[ChatPiece]:
        """The rest: held text; an unclosed tool call is dropped."""
        if self._finished:
            return []
        self._finished = True
        if self.state is _State.TOOL_CALL:
            self._drop_call()
            self._body = ""
        else:
            self._emit_text(self._pending)
            if self._held_space:
                self._out.append(ChatPiece(self.state.value, self._held_space))
                self._held_space = ""
        self._pending = ""
        return self._take()

    def _active_markers(self, state: _State) -> tuple[str, ...]:
        m = self.markers
        if state is _State.TOOL_CALL:
            return (m.tool_call_end,)
        active: list[str] = []
        if self.parse_reasoning:
            active += [m.reasoning_start, m.reasoning_end]
        if self.parse_tools:
            active += [m.tool_call_start, m.tool_call_end]
        return tuple(active)

    def _scan(self) -> None:
        while self._pending:
            if self.state is _State.TOOL_CALL:
                self._scan_tool_call()
                continue
            markers = self._markers_by_state[self.state]
            found = _first_marker(self._pending, markers)
            if found is None:
                keep = _longest_marker_prefix_suffix(self._pending, markers)
                self._emit_text(self._pending[: len(self._pending) - keep])
                self._pending = self._pending[len(self._pending) - keep :]
                return
            position, marker = found
            self._emit_text(self._pending[:position])
            self._pending = self._pending[position + len(marker) :]
            self._on_marker(marker)

    def _scan_tool_call(self) -> None:
        end = self.markers.tool_call_end
        self._body += self._pending
        self._pending = ""
        position = self._body.find(end, max(0, self._body_scanned - len(end) + 1))
        if position < 0:
            self._body_scanned = len(self._body)
            return
        body, self._pending = self._body[:position], self._body[position + len(end) :]
        self._body, self._body_scanned = "", 0
        call = self._parse_call(body)
        if call is None:
            self._drop_call()
        else:
            self._out.append(ChatPiece("tool_call", tool_call=call))
        self.state = _State.CONTENT
        self._after_marker = True

    def _on_marker(self, marker: str) -> None:
        m = self.markers
        self._held_space = ""  # a marker follows it
        self._holds_leading = False
        self._after_marker = True
        if marker == m.tool_call_start:
            self.state = _State.TOOL_CALL
        elif marker == m.reasoning_start:
            self.state = _State.REASONING
        elif marker == m.reasoning_end and self.state is _State.REASONING:
            self.state = _State.CONTENT
        # else a stray end marker: dropped, the state stays

    def _emit_text(self, text: str) -> None:
        if self._after_marker:
            text = text.lstrip()
            if not text:
                return
            self._after_marker = False
        text = self._held_space + text
        if self.state is _State.REASONING:
            body = text.rstrip()  # a `</think>` may follow
        elif self._holds_leading:
            body = "" if text.isspace() else text  # a first marker may follow
            self._holds_leading = body == ""
        else:
            body = text
        self._held_space = text[len(body) :]
        if body:
            self._out.append(ChatPiece(self.state.value, body))

    def _drop_call(self) -> None:
        """A tool call that did not parse (or never closed): neither a call nor content."""
        self.num_dropped_calls += 1

    def _parse_call(self, body: str) -> ParsedToolCall | None:
        parsed = parse_tool_call_body(body)
        if parsed is None:
            return None
        name, arguments = parsed
        call = ParsedToolCall(f"{self._id_prefix}{self._num_tool_calls}", name, arguments)
        self._num_tool_calls += 1
        return call

    def _take(self) -> list[ChatPiece]:
        out, self._out = _merge(self._out), []
        return out


def parse_all(
    text: str,
    thinking: bool,
    markers: ChatMarkers = DEFAULT_MARKERS,
    parse_tools: bool = True,
    *,
    parse_reasoning: bool = True,
    request_id: str = "",
) -> ParsedChat:
    """A whole output parsed by the streaming parser in one feed: the unary answer."""
    parser = ChatOutputParser(thinking, markers, parse_tools, parse_reasoning=parse_reasoning, request_id=request_id)
    return collect(parser.feed(text) + parser.finish())


def collect(pieces: list[ChatPiece]) -> ParsedChat:
    """Pieces joined by kind, tool calls in order."""
    chat = ParsedChat()
    content, reasoning = [], []
    for piece in pieces:
        if piece.kind == "content":
            content.append(piece.text)
        elif piece.kind == "reasoning":
            reasoning.append(piece.text)
        elif piece.tool_call is not None:
            chat.tool_calls.append(piece.tool_call)
    chat.content, chat.reasoning = "".join(content), "".join(reasoning)
    return chat


def parse_tool_call_body(body: str) -> tuple[str, str] | None:
    """(name, compact JSON arguments) of a Hermes tool-call body, or None when it is not one."""
    document = _loads(body.strip())
    if not isinstance(document, dict):
        return None
    name = document.get("name")
    if not isinstance(name, str) or not name.strip():
        return None
    key = "arguments" if "arguments" in document else "parameters"
    arguments = document.get(key)
    if arguments is None:
        arguments = {}
    elif isinstance(arguments, str):
        arguments = _loads(arguments)
    if not isinstance(arguments, dict):
        return None
    return name, json.dumps(arguments, separators=(",", ":"), ensure_ascii=False)


def _loads(text: str) -> Any:
    """JSON or None; NaN and Infinity are not JSON and are refused."""
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        return None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _first_marker(text: str, markers: tuple[str, ...]) -> tuple[int, str] | None:
    best: tuple[int, str] | None = None
    for marker in markers:
        position = text.find(marker)
        if position >= 0 and (best is None or position < best[0]):
            best = (position, marker)
    return best


def _longest_marker_prefix_suffix(text: str, markers: tuple[str, ...]) -> int:
    """The length of the longest suffix of `text` that is a proper prefix of one of `markers`."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if text.endswith(marker[:size]):
                longest = size
                break
    return longest


def _merge(pieces: list[ChatPiece]) -> list[ChatPiece]:
    merged: list[ChatPiece] = []
    for piece in pieces:
        if merged and piece.kind != "tool_call" and merged[-1].kind == piece.kind:
            merged[-1] = ChatPiece(piece.kind, merged[-1].text + piece.text)
        else:
            merged.append(piece)
    return merged


def drop_tool_calls_after(pieces: list[ChatPiece], num_seen: int, limit: int | None) -> tuple[list[ChatPiece], int]:
    """`pieces` without the tool calls past the first `limit` of the request (None: no limit).

    `num_seen` is how many calls earlier pieces held; returns the kept pieces and the new count.
    It is how `parallel_tool_calls` false reads under tool_choice AUTO, where no grammar holds the
    model to one call: the first is the answer, later ones are not returned.
    """
    if limit is None:
        return pieces, num_seen + sum(piece.kind == "tool_call" for piece in pieces)
    kept = []
    for piece in pieces:
        if piece.kind == "tool_call":
            num_seen += 1
            if num_seen > limit:
                continue
        kept.append(piece)
    return kept, num_seen
