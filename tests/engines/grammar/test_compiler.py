"""Compilation runs on the compiler's own threads, is shared and cached by (tokenizer, kind, text),
and a grammar that does not compile is refused with the compiler's reason."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

import pytest

from engines.grammar.compiler import GrammarCompiler, InvalidGrammarError
from engines.grammar.spec import GrammarKind, GrammarSpec, choice_spec, ebnf_spec, json_schema_spec, regex_spec


@dataclass
class AddedToken:
    special: bool


class FakeTokenizer:
    def __init__(self, tokens: list[str], special: tuple[int, ...] = (0,)):
        self.tokens = tokens
        self.all_special_ids = list(special)
        self.added_tokens_decoder = {i: AddedToken(True) for i in special}

    def get_vocab(self) -> dict[str, int]:
        return {token: i for i, token in enumerate(self.tokens)}


@dataclass
class FakeBackend:
    """Compiles to (kind, text); `gate` holds every compile until the test opens it."""

    gate: threading.Event = field(default_factory=threading.Event)
    compiled: list[GrammarSpec] = field(default_factory=list)
    threads: list[str] = field(default_factory=list)
    fail_with: Exception | None = None

    def compile(self, spec: GrammarSpec, cancelled=None):
        self.gate.wait(timeout=10)
        self.compiled.append(spec)
        self.threads.append(threading.current_thread().name)
        if self.fail_with is not None:
            raise self.fail_with
        return (spec.kind, spec.text)

    @staticmethod
    def size_of(compiled) -> int:
        return 10


def fake_compiler(backend: FakeBackend, tokens=("<s>", "a", "b"), **bounds) -> GrammarCompiler:
    return GrammarCompiler(FakeTokenizer(list(tokens)), len(tokens), frozenset({0}), backend=lambda: backend, **bounds)


def test_a_grammar_compiles_once_on_a_compile_thread_and_is_then_served_from_the_cache():
    backend = FakeBackend()
    backend.gate.set()
    compiler = fake_compiler(backend)
    spec = regex_spec("a+")
    assert compiler.submit(spec).result() == (GrammarKind.REGEX, "a+")
    assert compiler.submit(spec).result() == (GrammarKind.REGEX, "a+")
    assert backend.compiled == [spec] and backend.threads[0].startswith("dpgate-grammar")
    assert threading.current_thread().name not in backend.threads


def test_requests_for_a_grammar_still_compiling_share_one_compilation():
    backend = FakeBackend()
    compiler = fake_compiler(backend)
    futures = [compiler.submit(regex_spec("a+")) for _ in range(5)]
    assert all(f is futures[0] for f in futures) and not futures[0].done()
    backend.gate.set()
    assert futures[0].result() == (GrammarKind.REGEX, "a+") and len(backend.compiled) == 1


def test_the_key_is_kind_and_text_and_the_tokenizer():
    backend = FakeBackend()
    backend.gate.set()
    compiler = fake_compiler(backend)
    compiler.submit(GrammarSpec(GrammarKind.REGEX, "x")).result()
    compiler.submit(GrammarSpec(GrammarKind.EBNF, "x")).result()
    assert len(backend.compiled) == 2 and compiler.num_cached == 2
    same = fake_compiler(FakeBackend())
    other = fake_compiler(FakeBackend(), tokens=("<s>", "a", "c"))
    assert same.fingerprint == compiler.fingerprint != other.fingerprint
    assert compiler.key(regex_spec("x")) != other.key(regex_spec("x"))


def test_the_cache_is_bounded():
    backend = FakeBackend()
    backend.gate.set()
    compiler = fake_compiler(backend, max_entries=3)
    for i in range(5):
        compiler.submit(regex_spec(f"a{i}")).result()
    assert compiler.num_cached == 3
    compiler.submit(regex_spec("a0")).result()  # evicted: compiled again
    assert len(backend.compiled) == 6


def test_a_refusal_is_cached_and_an_engine_fault_is_not():
    backend = FakeBackend(fail_with=RuntimeError("[11:32:57] /project/cpp/regex_converter.cc:94: bad regex"))
    backend.gate.set()
    compiler = fake_compiler(backend)
    with pytest.raises(InvalidGrammarError, match=r"^structured_output.regex does not compile: bad regex$"):
        compiler.submit(regex_spec("(")).result()
    with pytest.raises(InvalidGrammarError):
        compiler.submit(regex_spec("(")).result()
    assert len(backend.compiled) == 1
    backend.fail_with = MemoryError()
    for _ in range(2):
        with pytest.raises(MemoryError):
            compiler.submit(regex_spec("b")).result()
    assert len(backend.compiled) == 3


def test_awaiting_a_slow_compile_leaves_the_event_loop_free():
    backend = FakeBackend()
    compiler = fake_compiler(backend)

    async def scenario() -> int:
        compiling = asyncio.ensure_future(compiler.compile(regex_spec("a+")))
        ticks = 0
        for _ in range(20):  # the loop keeps running other work while the compile is held
            await asyncio.sleep(0)
            ticks += 1
        assert not compiling.done()
        backend.gate.set()
        assert await compiling == (GrammarKind.REGEX, "a+")
        return ticks

    assert asyncio.run(scenario()) == 20


REFUSED = [
    (regex_spec("a(b"), "structured_output.regex does not compile: Regex parsing error at position 4"),
    (regex_spec("(?<=a)b"), "structured_output.regex does not compile: Regex parsing error at position 3: Lookbehind"),
    (ebnf_spec('root ::= "a" | rule2'), "structured_output.ebnf does not compile: EBNF parser error at line 1"),
    (json_schema_spec('{"type": "strin"}'), 'structured_output.json_schema does not compile: Unsupported type "strin"'),
    (
        json_schema_spec('{"type": "integer", "minimum": 5, "maximum": 1}'),
        "structured_output.json_schema does not compile: Invalid range: minimum greater than maximum",
    ),
]


@pytest.mark.parametrize(("spec", "message"), REFUSED)
@pytest.mark.e2e  # compiles in the grammar compiler's child process
def test_xgrammar_refusals_carry_the_compilers_reason(smollm2_compiler, spec, message):
    with pytest.raises(InvalidGrammarError) as error:
        smollm2_compiler.submit(spec).result()
    assert str(error.value).startswith(message), str(error.value)
    assert "/project/" not in str(error.value)


@pytest.mark.e2e  # compiles in the grammar compiler's child process
def test_every_kind_compiles_on_the_real_vocabulary(smollm2_compiler):
    specs = [json_schema_spec('{"type": "string"}'), regex_spec("[0-9]+"), ebnf_spec('root ::= "a"+')]
    specs += [choice_spec(['say "hi"', "été"]), GrammarSpec(GrammarKind.JSON_OBJECT, "")]
    for spec in specs:
        assert smollm2_compiler.submit(spec).result().memory_size_bytes > 0


@pytest.mark.parametrize(
    "failure",
    [
        RuntimeError("[10:03:11] /project/cpp/json_schema_converter.cc:812: Check failed: (error.empty()) is false: "),
        RuntimeError(""),
        ValueError(),
    ],
)
def test_an_internal_failure_of_the_grammar_library_reads_as_a_sentence(failure):
    backend = FakeBackend(fail_with=failure)
    backend.gate.set()
    with pytest.raises(InvalidGrammarError) as error:
        fake_compiler(backend).submit(json_schema_spec('{"type": "string"}')).result()
    message = str(error.value)
    assert message.startswith("structured_output.json_schema does not compile: "), message
    for leak in ("Check failed", "error.empty", "RuntimeError", "ValueError", ".cc"):
        assert leak not in message, message
