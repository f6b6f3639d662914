"""The fuzz workload's requests, drawn by hypothesis: random field values of every dpgate.v1 request
(huge and empty strings, unicode, out-of-range numbers and token ids), random metadata (rank values
that are and are not unsigned 32-bit integers), bodies that are not valid protobuf, and gRPC
messages cut short on the wire.

A `FuzzCase` is plain bytes and strings, so one list can be drawn first and then sent concurrently
(hypothesis runs its test function one example at a time; sending from inside it would serialise
the whole workload). Values stay within what a gRPC client can send at all (legal metadata keys,
printable ASCII values, valid UTF-8): anything else fails in the client, before a server sees it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from dpgate.v1 import control_pb2, generate_pb2

INFERENCE = "/dpgate.v1.InferenceService/"
CONTROL = "/dpgate.v1.ControlService/"
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
STREAMING = frozenset({INFERENCE + "GenerateStream", INFERENCE + "ChatStream"})
UNKNOWN_METHODS = (INFERENCE + "Complete", "/dpgate.v1.NoSuchService/Generate", "/x/y")
RANK_KEY = "x-data-parallel-rank"
VOCAB_SIZE = 49152  # SmolLM2's tokenizer, shared by the tiny test model; ids past it are out of range
U32, I32, U64 = (1 << 32) - 1, (1 << 31) - 1, (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class FuzzCase:
    """One request. `transport` "grpc" sends `body` as the one request message of a gRPC call;
    "raw" sends `body` as the call's whole DATA payload (gRPC framing included, possibly cut short)
    over a raw HTTP/2 stream; "cut-frame" sends the call's frames (`body` as DATA) after a valid
    preface, stops `keep_permille`/1000 of the way through them and shuts its side of the socket."""

    kind: str
    path: str
    body: bytes
    metadata: tuple[tuple[str, str | bytes], ...] = ()
    transport: str = "grpc"
    keep_permille: int = 1000


def _unicode(max_size: int = 40) -> st.SearchStrategy[str]:
    """Random unicode (no lone surrogates: they are not UTF-8); long ones repeat a short random piece,
    since hypothesis draws every character separately and bounds what one example may draw."""
    short = st.text(st.characters(exclude_categories=("Cs",)), max_size=min(max_size, 12))
    if max_size <= 12:
        return short
    return st.one_of(short, st.builds(lambda piece, count: (piece * count)[:max_size], short, st.integers(1, max_size)))


def _huge() -> st.SearchStrategy[str]:
    """Strings from 64 KiB to ~6 MiB of UTF-8: past the context, and past --max-message-bytes (4 MiB)."""
    return st.builds(lambda unit, count: unit * count, st.sampled_from(["a", "é", "語", "😀", " ", "\x00"]),
                     st.integers(1 << 16, 6 << 20 >> 2))  # fmt: skip


def _rarely(rare: st.SearchStrategy, common: st.SearchStrategy, percent: int = 2) -> st.SearchStrategy:
    """`rare` in `percent` of the draws, else `common` (one_of would give each branch an equal share)."""
    return st.sampled_from([True] * percent + [False] * (100 - percent)).flatmap(lambda r: rare if r else common)


def _text() -> st.SearchStrategy[str]:
    """Empty, short or long unicode, and now and then a huge string."""
    return _rarely(_huge(), st.one_of(st.just(""), _unicode(), _unicode(400)))


_floats = st.floats(width=32)


def _small_or_any(low: int, high: int, bound_low: int, bound_high: int) -> st.SearchStrategy[int]:
    """Often a small value near the valid range's edges, else anything the field's type holds."""
    return st.one_of(st.integers(low, high), st.integers(bound_low, bound_high))


_token_id = st.one_of(st.integers(0, VOCAB_SIZE - 1), st.integers(VOCAB_SIZE, U32))


def _message(cls, **fields: st.SearchStrategy) -> st.SearchStrategy:
    """`cls(**kwargs)` for a random subset of `fields` (absent fields stay unset)."""
    return st.fixed_dictionaries({}, optional=fields).map(lambda kwargs: cls(**kwargs))


_sampling = _message(
    generate_pb2.SamplingParams, temperature=st.one_of(st.just(0.0), _floats),
    top_k=_small_or_any(-2, 50, -I32 - 1, I32), top_p=_floats, min_p=_floats, seed=st.integers(0, U64),
    repetition_penalty=_floats, presence_penalty=_floats, frequency_penalty=_floats,
    logit_bias=st.dictionaries(_token_id, _floats, max_size=4),
)  # fmt: skip
_stopping = _message(
    generate_pb2.StoppingCriteria, max_tokens=_small_or_any(-2, 6, -I32 - 1, I32),
    min_tokens=_small_or_any(-2, 6, -I32 - 1, I32), stop=st.lists(_unicode(8), max_size=3),
    stop_token_ids=st.lists(_token_id, max_size=3), ignore_eos=st.booleans(),
)  # fmt: skip
_structured = st.one_of(
    st.builds(lambda text: generate_pb2.StructuredOutput(json_schema=text), _unicode(60)),
    st.just(generate_pb2.StructuredOutput(json_object=generate_pb2.JsonObject())),
    st.builds(lambda text: generate_pb2.StructuredOutput(regex=text), _unicode(20)),
    st.builds(lambda text: generate_pb2.StructuredOutput(ebnf=text), _unicode(60)),
    st.builds(lambda items: generate_pb2.StructuredOutput(choice=generate_pb2.ChoiceList(choices=items)),
              st.lists(_unicode(6), max_size=3)),
)  # fmt: skip
_logprobs = _message(generate_pb2.LogprobsOptions, top_n=_small_or_any(0, 22, 0, U32))
_prompt_ids = st.builds(
    lambda ids: generate_pb2.TokenIds(ids=ids),
    _rarely(
        st.integers(1025, 3000).map(lambda count: [0] * count), st.lists(_token_id, max_size=24)
    ),  # past the context
)


def _generate(cls) -> st.SearchStrategy:
    common = {"request_id": _unicode(), "model": st.one_of(st.just(""), _unicode(20)), "sampling": _sampling,
              "stopping": _stopping, "logprobs": _logprobs}  # fmt: skip
    rare = {"structured_output": _structured}
    by_text = st.fixed_dictionaries({"text": _text()}, optional={**common, **rare})
    by_ids = st.fixed_dictionaries({"token_ids": _prompt_ids}, optional=common)
    return st.one_of(by_text, by_ids).map(lambda kwargs: cls(**kwargs))


_json_scalar = st.one_of(st.none(), st.booleans(), st.floats(allow_nan=False, allow_infinity=False), _unicode(10))
_json = st.recursive(
    _json_scalar,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_unicode(8), inner, max_size=3),
    max_leaves=8,
)


def _struct(values: dict) -> struct_pb2.Struct:
    message = struct_pb2.Struct()
    message.update(values)
    return message


_tool_call = _message(generate_pb2.ToolCall, id=_unicode(8), name=_unicode(8), arguments=_unicode(30))
_chat_message = _message(
    generate_pb2.ChatMessage, role=st.integers(-1, 6), content=_text(), reasoning_content=_unicode(),
    tool_calls=st.lists(_tool_call, max_size=2), tool_call_id=_unicode(8), name=_unicode(8),
)  # fmt: skip
_tool = _message(generate_pb2.Tool, name=st.one_of(st.text("abcxyz_", min_size=1, max_size=10), _unicode(70)),
                 description=_unicode(), parameters=st.one_of(st.just('{"type": "object"}'), _unicode(30)))  # fmt: skip
_tool_choice = st.one_of(
    st.builds(lambda mode: generate_pb2.ToolChoice(mode=mode), st.integers(0, 5)),
    st.builds(lambda name: generate_pb2.ToolChoice(tool_name=name), _unicode(10)),
)


def _chat(cls) -> st.SearchStrategy:
    return _message(
        cls, request_id=_unicode(), model=st.one_of(st.just(""), _unicode(20)),
        messages=st.lists(_chat_message, max_size=3), tools=st.lists(_tool, max_size=2), tool_choice=_tool_choice,
        chat_template_kwargs=st.dictionaries(_unicode(12), _json, max_size=3).map(_struct),
        sampling=_sampling, stopping=_stopping, structured_output=_structured, logprobs=_logprobs,
    )  # fmt: skip


_BODIES = {
    INFERENCE + "Generate": _generate(generate_pb2.GenerateRequest),
    INFERENCE + "GenerateStream": _generate(generate_pb2.GenerateStreamRequest),
    INFERENCE + "Chat": _chat(generate_pb2.ChatRequest),
    INFERENCE + "ChatStream": _chat(generate_pb2.ChatStreamRequest),
    CONTROL + "GetServerInfo": st.just(control_pb2.GetServerInfoRequest()),
    CONTROL + "GetModelInfo": st.just(control_pb2.GetModelInfoRequest()),
    CONTROL + "GetLoad": st.just(control_pb2.GetLoadRequest()),
    CONTROL + "Abort": _message(control_pb2.AbortRequest, request_ids=st.lists(_unicode(), max_size=4)),
}

_rank_value = st.one_of(
    st.integers(0, 1).map(str), st.integers(-3, 1 << 33).map(str),
    st.sampled_from(["", " 1 ", "+1", "-0", "1.0", "0x1", "1e3", "01", "4294967295", "4294967296", "one"]),
)  # fmt: skip
# Legal metadata keys of our own (not grpc-* or the HTTP/2 fields a gRPC client refuses to send).
_key = st.text("abcdefghijklmnopqrstuvwxyz0123456789_.-", min_size=1, max_size=16).map(lambda tail: "x-" + tail)
_ascii_value = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40)
_metadata_pair = st.one_of(
    st.tuples(st.just(RANK_KEY), _rank_value),
    st.tuples(_key, _ascii_value),
    st.tuples(_key.map(lambda key: key + "-bin"), st.binary(max_size=40)),
    st.tuples(st.just(RANK_KEY + "-bin"), st.binary(max_size=8)),
)
# One value of up to 40 KiB: past --max-header-list-size (16 KiB) is that call's RESOURCE_EXHAUSTED.
# (A field block past twice that plus 16 KiB ends the whole connection, with every call on it:
# tests/gateway/test_front_door_limits_e2e.py covers that; here it would fail the innocent calls.)
_big_value = st.integers(1 << 10, 40 << 10).map(lambda size: (("x-big", "v" * size),))
_metadata = st.tuples(st.lists(_metadata_pair, max_size=3), _rarely(_big_value, st.just(()), 3)).map(
    lambda parts: (*parts[0], *parts[1])
)


def _mangled(body: bytes, data: st.DataObject) -> bytes:
    """`body` with bytes flipped, cut or appended: mostly not a valid message any more."""
    how = data.draw(st.sampled_from(["flip", "cut", "append"]))
    if how == "cut" or not body:
        return body[: data.draw(st.integers(0, max(0, len(body) - 1)))]
    if how == "append":
        return body + data.draw(st.binary(min_size=1, max_size=16))
    at = data.draw(st.integers(0, len(body) - 1))
    return body[:at] + bytes([body[at] ^ data.draw(st.integers(1, 255))]) + body[at + 1 :]


def _grpc_framed(payload: bytes, data: st.DataObject) -> bytes:
    """A gRPC length-prefixed message that lies: a prefix claiming more than follows, a cut prefix,
    a compressed flag with no encoding, or two messages where one is allowed."""
    how = data.draw(st.sampled_from(["long-prefix", "cut-prefix", "flag", "two", "empty"]))
    if how == "long-prefix":
        return struct.pack(">BL", 0, len(payload) + data.draw(st.integers(1, 1 << 20))) + payload
    if how == "cut-prefix":
        return struct.pack(">BL", 0, len(payload))[: data.draw(st.integers(1, 4))]
    if how == "flag":
        return struct.pack(">BL", data.draw(st.integers(1, 255)), len(payload)) + payload
    if how == "two":
        return (struct.pack(">BL", 0, len(payload)) + payload) * 2
    return b""


# Shares of the kinds, in percent: mostly well-formed messages with random field values.
KIND_SHARES = {"unknown-method": 3, "health": 2, "garbage": 7, "mangled": 8, "bad-grpc-frame": 6, "cut-http2-frame": 1}
KIND_SHARES["fields"] = 100 - sum(KIND_SHARES.values())
_kind = st.sampled_from([kind for kind, share in KIND_SHARES.items() for _ in range(share)])


@st.composite
def fuzz_case(draw) -> FuzzCase:
    data = draw(st.data())
    kind = draw(_kind)
    path = draw(st.sampled_from(sorted(_BODIES)))
    metadata = draw(_metadata)
    if kind == "unknown-method":
        return FuzzCase("unknown-method", draw(st.sampled_from(UNKNOWN_METHODS)), b"", metadata)
    if kind == "health":
        service = draw(st.one_of(st.sampled_from(["", "dpgate.v1.InferenceService", "liveness"]), _unicode(20)))
        return FuzzCase("health", HEALTH_CHECK, health_pb2.HealthCheckRequest(service=service).SerializeToString(),
                        metadata)  # fmt: skip
    valid = draw(_BODIES[path]).SerializeToString()
    if kind == "garbage":
        return FuzzCase("garbage", path, draw(st.binary(max_size=64)), metadata)
    if kind == "mangled":
        return FuzzCase("mangled", path, _mangled(valid, data), metadata)
    if kind == "bad-grpc-frame":
        return FuzzCase("bad-grpc-frame", path, _grpc_framed(valid, data), (), "raw")
    if kind == "cut-http2-frame":
        whole = struct.pack(">BL", 0, len(valid)) + valid
        return FuzzCase("cut-http2-frame", path, whole, (), "cut-frame", draw(st.integers(0, 1000)))
    return FuzzCase("fields", path, valid, metadata)


def draw_cases(count: int, seed_value: int) -> list[FuzzCase]:
    """`count` cases drawn by hypothesis from `seed_value` (the same seed gives the same cases)."""
    cases: list[FuzzCase] = []

    @seed(seed_value)
    @settings(max_examples=count, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(fuzz_case())
    def collect(case: FuzzCase) -> None:
        cases.append(case)

    collect()
    return cases
