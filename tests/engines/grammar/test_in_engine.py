"""Grammar-masked sampling in the engine, on SmolLM2 as `dpgate engine` serves it (float32
activations, int8 weights, batch-invariant kernels): outputs follow their grammar, a request's
stop tokens wait for the grammar to end, a conflict ends only its own request, and a constrained
request's tokens and logprobs do not depend on its neighbours or on preemption."""

from __future__ import annotations

import ast
import asyncio
import json
import re
import threading

import jsonschema
import pytest

from dpgate.v1 import generate_pb2 as pb
from engines.engine import LLMEngine
from engines.grammar.compiler import GrammarCompiler, InvalidGrammarError, XgrammarBackend
from engines.grammar.errors import GrammarConflictError
from engines.grammar.matcher import RequestGrammar
from engines.grammar.vocab import encoded_vocabulary
from engines.model.source import resolve_model
from engines.runner.model_runner import ModelRunner
from engines.scheduling.scheduler import SchedulerConfig
from engines.scheduling.sequence import FinishReason
from engines.serving.async_engine import AsyncEngine
from engines.serving.request_builder import ModelLimits, build_sequence
from tests.engines.kernel_choice import load_with_kernels

pytestmark = pytest.mark.e2e  # every test here runs SmolLM2

MAX_MODEL_LEN = 1024
CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def smollm2():
    return load_with_kernels(resolve_model("smollm2-135m-instruct"), "batch-invariant", quantization="int8")


@pytest.fixture(scope="module")
def compiler(smollm2):
    tokenizer = smollm2.tokenizer
    compiler = GrammarCompiler(tokenizer.tokenizer, smollm2.config.vocab_size, tokenizer.eos_token_ids)
    yield compiler
    compiler.shutdown()


def make_engine(loaded, num_blocks=256, **scheduler) -> LLMEngine:
    return LLMEngine(
        ModelRunner(loaded, MAX_MODEL_LEN, num_blocks=num_blocks, block_size=16), SchedulerConfig(**scheduler)
    )


def request(request_id, prompt, structured_output=None, max_tokens=96, temperature=0.0, seed=None, **stopping):
    sampling = pb.SamplingParams(temperature=temperature, logit_bias=stopping.pop("logit_bias", {}))
    if seed is not None:
        sampling.seed = seed
    wire = pb.GenerateRequest(
        request_id=request_id,
        text=CHAT.format(prompt),
        sampling=sampling,
        stopping=pb.StoppingCriteria(max_tokens=max_tokens, **stopping),
        logprobs=pb.LogprobsOptions(top_n=2),
    )
    if structured_output is not None:
        wire.structured_output.CopyFrom(structured_output)
    return wire


def sequence(loaded, compiler, wire):
    """What AsyncEngine does with a request: build it, compile its grammar, give it a matcher."""
    tokenizer = loaded.tokenizer
    limits = ModelLimits("m", loaded.config.vocab_size, MAX_MODEL_LEN, tokenizer.eos_token_ids)
    seq = build_sequence(wire, limits, tokenizer.tokenizer)
    if seq.grammar_spec is not None:
        compiled = compiler.submit(seq.grammar_spec).result()
        seq.grammar = RequestGrammar(compiled, seq.stop_token_ids, loaded.config.vocab_size)
    return seq


def run(engine, seqs):
    for seq in seqs:
        engine.add(seq)
    while engine.has_work:
        engine.step()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    return {seq.request_id: seq for seq in seqs}


def schema_output(schema) -> pb.StructuredOutput:
    return pb.StructuredOutput(json_schema=json.dumps(schema))


SHORT_STRING = schema_output({"type": "string", "maxLength": 12})


def test_a_biased_user_stop_token_waits_for_the_closing_quote(smollm2, compiler):
    """Token "a" is ordinary text and a stop token of the request, pushed up by +100: free, the
    request stops at once; under {"type": "string"} it is masked inside the string and taken
    right after the closing quote."""
    a = smollm2.tokenizer.tokenizer.convert_tokens_to_ids("a")
    fields = {"stop_token_ids": [a], "logit_bias": {a: 100.0}}
    free = sequence(smollm2, compiler, request("free", "Name a fruit.", **fields))
    constrained = sequence(smollm2, compiler, request("json", "Name a fruit.", SHORT_STRING, **fields))
    done = run(make_engine(smollm2), [free, constrained])
    assert done["free"].output_ids == [a] and done["free"].stop_token_id == a
    seq = done["json"]
    assert seq.finish_reason is FinishReason.STOP and seq.stop_token_id == a
    assert seq.output_ids[-1] == a and a not in seq.output_ids[:-1]
    assert isinstance(json.loads(seq.output_text), str) and seq.output_text.endswith('"')


def test_a_biased_eos_waits_for_the_closing_quote(smollm2, compiler):
    eos = 2
    constrained = sequence(smollm2, compiler, request("json", "Name a fruit.", SHORT_STRING, logit_bias={eos: 100.0}))
    seq = run(make_engine(smollm2), [constrained])["json"]
    assert seq.finish_reason is FinishReason.STOP and seq.stop_token_id == eos
    assert eos not in seq.output_ids[:-1] and isinstance(json.loads(seq.output_text), str)


def bounded_string(length: int) -> dict:
    return {"type": "string", "maxLength": length}


SCHEMAS = [
    {  # required fields, bounded integer
        "type": "object",
        "properties": {"name": bounded_string(20), "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"],
    },
    {  # nested objects
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 999}, "email": bounded_string(24)},
                "required": ["id", "email"],
            },
            "active": {"type": "boolean"},
        },
        "required": ["user", "active"],
    },
    {"type": "array", "items": bounded_string(10), "minItems": 1, "maxItems": 4},  # array bounds
    {  # enums
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}, "size": {"type": "string", "enum": ["S", "M"]}},
        "required": ["color", "size"],
    },
    {  # numbers with bounds
        "type": "object",
        "properties": {"celsius": {"type": "number", "minimum": -50, "maximum": 50}},
        "required": ["celsius"],
    },
    {  # string lengths
        "type": "object",
        "properties": {"code": {"type": "string", "minLength": 3, "maxLength": 6}, "note": bounded_string(15)},
        "required": ["code", "note"],
    },
    {  # one required field among optional ones
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 0, "maximum": 99},
            "nickname": bounded_string(10),
            "vip": {"type": "boolean"},
        },
        "required": ["id"],
    },
    {  # an array of objects
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "maxItems": 3,
                "items": {
                    "type": "object",
                    "properties": {"sku": bounded_string(8), "qty": {"type": "integer", "minimum": 1, "maximum": 99}},
                    "required": ["sku", "qty"],
                },
            }
        },
        "required": ["items"],
    },
    {  # nested arrays
        "type": "object",
        "properties": {
            "matrix": {
                "type": "array",
                "maxItems": 2,
                "items": {"type": "array", "maxItems": 3, "items": {"type": "integer", "minimum": 0, "maximum": 9}},
            }
        },
        "required": ["matrix"],
    },
    {  # a union with null, a const and a pattern
        "type": "object",
        "properties": {
            "version": {"const": 2},
            "parent": {"type": ["string", "null"], "maxLength": 8},
            "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
        },
        "required": ["version", "parent", "zip"],
    },
]
REGEX = r"[A-Z][a-z]{2,8} [0-9]{2}"
CHOICES = ["positive", "negative", "neutral"]
EBNF = """root ::= expr
expr ::= term ([+*-] term){0,3}
term ::= [0-9]{1,3} | "(" expr ")"
"""


def test_ten_schemas_ten_sampled_requests_each_and_regex_choice_ebnf_all_follow_their_grammar(smollm2, compiler):
    wires = [
        request(f"s{i}-{j}", "Reply in JSON.", schema_output(schema), temperature=1.0, seed=100 * i + j)
        for i, schema in enumerate(SCHEMAS)
        for j in range(10)
    ]
    wires += [
        request(f"regex-{j}", "A name and an age.", pb.StructuredOutput(regex=REGEX), 32, 1.0, j) for j in range(5)
    ]
    choice = pb.StructuredOutput(choice=pb.ChoiceList(choices=CHOICES))
    wires += [request(f"choice-{j}", "Sentiment of: I love it.", choice, 16, 1.0, j) for j in range(5)]
    wires += [request(f"ebnf-{j}", "An arithmetic sum.", pb.StructuredOutput(ebnf=EBNF), 48, 1.0, j) for j in range(5)]
    done = run(make_engine(smollm2, max_num_seqs=32), [sequence(smollm2, compiler, wire) for wire in wires])
    for request_id, seq in done.items():
        assert seq.finish_reason is FinishReason.STOP and seq.stop_token_id == 2, (request_id, seq.output_text)
        text = seq.output_text
        kind, index = request_id.split("-")[0], request_id.split("-")[0][1:]
        if kind == "regex":
            assert re.fullmatch(REGEX, text), text
        elif kind == "choice":
            assert text in CHOICES
        elif kind == "ebnf":
            ast.parse(text, mode="eval")
            assert re.fullmatch(r"[0-9+*() -]+", text), text
        else:
            jsonschema.validate(json.loads(text), SCHEMAS[int(index)])


def test_a_stop_token_the_grammar_needs_next_ends_that_request_with_the_conflict_only(smollm2, compiler):
    tokenizer = smollm2.tokenizer.tokenizer
    a, b = tokenizer.convert_tokens_to_ids("a"), tokenizer.convert_tokens_to_ids("b")
    needs_b = pb.StructuredOutput(regex="ab")
    neighbours = [
        request("json", "Reply in JSON.", schema_output(SCHEMAS[0]), temperature=1.0, seed=1),
        request("free", "Tell me a joke.", max_tokens=12, temperature=0.8, seed=2),
    ]

    def tokens(seqs):
        return {seq.request_id: (seq.output_ids, seq.finish_reason) for seq in seqs.values()}

    alone = tokens(run(make_engine(smollm2), [sequence(smollm2, compiler, w) for w in neighbours]))
    conflicted = request("conflict", "Say ab.", needs_b, stop_token_ids=[b], logit_bias={a: 100.0})
    batch = run(make_engine(smollm2), [sequence(smollm2, compiler, w) for w in [conflicted, *neighbours]])
    seq = batch.pop("conflict")
    assert seq.output_ids == [a] and seq.finish_reason is FinishReason.ABORTED
    assert isinstance(seq.error, GrammarConflictError)
    assert f"the grammar can only continue with token(s) [{b}], which are stop tokens of this request" in str(seq.error)
    assert tokens(batch) == alone


def test_a_constrained_request_gives_the_same_bits_alone_beside_others_and_after_preemption(smollm2, compiler):
    """Seeded sampling with logprobs: alone; beside a constrained and an unconstrained neighbour;
    and on a 10-block cache that preempts (recomputes) while its matcher holds its state."""
    target = request("target", "Reply in JSON.", schema_output(SCHEMAS[7]), max_tokens=80, temperature=0.9, seed=7)
    others = [
        request("json", "Reply in JSON.", schema_output(SCHEMAS[1]), temperature=1.0, seed=8),
        request("free", "Write a poem.", max_tokens=80, temperature=0.8, seed=9),
        request("regex", "A name.", pb.StructuredOutput(regex=REGEX), 32, 1.0, 3),
    ]

    def sampled(engine, wires):
        seqs = [sequence(smollm2, compiler, w) for w in wires]
        outputs = {seq.request_id: [] for seq in seqs}
        for seq in seqs:
            engine.add(seq)
        while engine.has_work:
            for output in engine.step():
                outputs[output.request_id].extend(output.logprobs)
        return outputs["target"], engine.scheduler.num_preemptions

    alone, _ = sampled(make_engine(smollm2), [target])
    beside, _ = sampled(make_engine(smollm2), [*others, target])
    preempted, preemptions = sampled(make_engine(smollm2, num_blocks=10, max_num_seqs=4), [*others, target])
    assert preemptions > 0
    assert len(alone) > 10 and beside == alone and preempted == alone


class GatedBackend:
    """The real compiler, held until the test opens the gate (a compile as slow as the test wants)."""

    def __init__(self, backend: XgrammarBackend):
        self.backend = backend
        self.gate = threading.Event()

    def compile(self, spec, cancelled=None):
        self.gate.wait(timeout=60)
        return self.backend.compile(spec, cancelled)

    def size_of(self, compiled) -> int:
        return self.backend.size_of(compiled)


def test_a_slow_compile_stalls_no_other_request_and_a_bad_grammar_fails_before_any_token(smollm2):
    tokenizer = smollm2.tokenizer
    vocab_size, eos = smollm2.config.vocab_size, tokenizer.eos_token_ids
    gated = GatedBackend(XgrammarBackend(encoded_vocabulary(tokenizer.tokenizer, vocab_size), tokenizer.tokenizer, eos))
    grammars = GrammarCompiler(tokenizer.tokenizer, vocab_size, eos, backend=lambda: gated)
    limits = ModelLimits("m", vocab_size, MAX_MODEL_LEN, eos)

    async def scenario():
        engine = AsyncEngine(make_engine(smollm2), asyncio.get_running_loop(), grammars)

        async def collect(wire):
            outputs = []
            async for output in engine.generate(build_sequence(wire, limits, tokenizer.tokenizer)):
                outputs.append(output)
            return outputs

        try:
            slow = asyncio.ensure_future(collect(request("slow", "Reply in JSON.", schema_output(SCHEMAS[3]))))
            free = await collect(request("free", "Tell me a joke.", max_tokens=12, ignore_eos=True))
            assert not slow.done()  # every token of "free" came while the grammar was still compiling
            gated.gate.set()
            outputs = await slow
            with pytest.raises(InvalidGrammarError, match=r"structured_output\.regex does not compile"):
                await collect(request("bad", "x", pb.StructuredOutput(regex="a(b")))
            return free, outputs
        finally:
            engine.shutdown()
            grammars.shutdown()

    free, slow = asyncio.run(scenario())
    assert sum(len(o.token_ids) for o in free) == 12
    assert slow[-1].finish_reason is FinishReason.STOP
    jsonschema.validate(json.loads("".join(o.text for o in slow)), SCHEMAS[3])
