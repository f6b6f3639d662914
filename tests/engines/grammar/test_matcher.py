"""One matcher per request, on the real SmolLM2 vocabulary, driven with fixed token ids: the
request's stop tokens are masked until the grammar can end, control tokens are never text, and a
mask that allows nothing names its conflict."""

from __future__ import annotations

import pytest
import torch

from dpgate.v1 import generate_pb2 as pb
from engines.grammar.bitmask import MaskBuffers, mask_constrained_rows
from engines.grammar.bits import allowed_token_ids, clear_bits, clear_bits_of_rows
from engines.grammar.matcher import RequestGrammar
from engines.grammar.spec import json_schema_spec, regex_spec
from engines.grammar.vocab import special_token_ids
from engines.sampling.tokens import SampledToken
from engines.scheduling.sequence import FinishReason
from engines.serving.request_builder import ModelLimits, build_sequence
from tests.engines.grammar.conftest import SMOLLM2_EOS, SMOLLM2_VOCAB_SIZE

LIMITS = ModelLimits("m", SMOLLM2_VOCAB_SIZE, 2048, frozenset({SMOLLM2_EOS}))


@pytest.fixture(scope="module")
def ids(smollm2_tokenizer):
    """Single-token ids of some ordinary text."""
    table = {text: smollm2_tokenizer.convert_tokens_to_ids(text) for text in ('"', "a", "b", "1")}
    assert all(smollm2_tokenizer.decode([i]) == text for text, i in table.items())
    return table


def allowed(grammar: RequestGrammar) -> set[int]:
    bitmask = torch.zeros(1, SMOLLM2_VOCAB_SIZE // 32, dtype=torch.int32)
    grammar.fill(bitmask, 0)
    return set(allowed_token_ids(bitmask[0], SMOLLM2_VOCAB_SIZE))


def grammar_for(compiler, spec, stop_token_ids) -> RequestGrammar:
    return RequestGrammar(compiler.submit(spec).result(), frozenset(stop_token_ids), SMOLLM2_VOCAB_SIZE)


@pytest.mark.e2e  # compiles in the grammar compiler's child process
def test_a_user_stop_token_of_ordinary_text_is_masked_inside_a_string_and_allowed_after_it(smollm2_compiler, ids):
    quote, a, b = ids['"'], ids["a"], ids["b"]
    grammar = grammar_for(smollm2_compiler, json_schema_spec('{"type": "string"}'), {SMOLLM2_EOS, a})
    assert quote in allowed(grammar) and a not in allowed(grammar) and SMOLLM2_EOS not in allowed(grammar)
    grammar.accept(quote)
    inside = allowed(grammar)
    assert a not in inside and SMOLLM2_EOS not in inside  # "a" is text the string could hold, but it stops
    assert b in inside and quote in inside
    grammar.accept(b)
    grammar.accept(quote)
    after = allowed(grammar)
    assert after == {a, SMOLLM2_EOS}  # the grammar can end: only the request's stop tokens remain
    grammar.accept(a)
    assert grammar.is_terminated


@pytest.mark.e2e  # compiles in the grammar compiler's child process
def test_without_the_user_stop_token_the_same_text_is_ordinary_inside_the_string(smollm2_compiler, ids):
    grammar = grammar_for(smollm2_compiler, json_schema_spec('{"type": "string"}'), {SMOLLM2_EOS})
    grammar.accept(ids['"'])
    assert ids["a"] in allowed(grammar)


@pytest.mark.e2e  # compiles in the grammar compiler's child process
def test_the_models_eos_is_masked_until_the_grammar_can_end(smollm2_compiler, ids):
    grammar = grammar_for(smollm2_compiler, json_schema_spec('{"type": "string"}'), {SMOLLM2_EOS})
    grammar.accept(ids['"'])
    assert SMOLLM2_EOS not in allowed(grammar)
    grammar.accept(ids['"'])
    assert allowed(grammar) == {SMOLLM2_EOS}
    grammar.accept(SMOLLM2_EOS)
    assert grammar.is_terminated


@pytest.mark.e2e  # compiles in the grammar compiler's child process
def test_control_tokens_are_never_text_inside_json(smollm2_compiler, smollm2_tokenizer, ids):
    specials = special_token_ids(smollm2_tokenizer)
    assert {0, 1, 2} <= specials  # <|endoftext|>, <|im_start|>, <|im_end|>
    grammar = grammar_for(smollm2_compiler, json_schema_spec('{"type": "string"}'), {SMOLLM2_EOS})
    grammar.accept(ids['"'])
    assert not allowed(grammar) & specials


@pytest.mark.e2e  # compiles in the grammar compiler's child process
def test_a_sequence_accepts_into_its_grammar_and_stops_when_the_matcher_terminates(
    smollm2_compiler, smollm2_tokenizer, ids
):
    request = pb.GenerateRequest(text="x", structured_output=pb.StructuredOutput(regex="ab"))
    seq = build_sequence(request, LIMITS, smollm2_tokenizer)
    seq.grammar = grammar_for(smollm2_compiler, seq.grammar_spec, seq.stop_token_ids)
    for token_id in (ids["a"], ids["b"]):
        assert seq.append(SampledToken(token_id)).finish_reason is None
    output = seq.append(SampledToken(SMOLLM2_EOS))
    assert output.finish_reason is FinishReason.STOP and output.stop_token_id == SMOLLM2_EOS
    assert seq.grammar.is_terminated and seq.output_text == "ab"


@pytest.mark.e2e  # compiles in the grammar compiler's child process
def test_sync_rolls_the_matcher_back_and_forward_to_the_sequences_tokens(smollm2_compiler, ids):
    grammar = grammar_for(smollm2_compiler, regex_spec("[ab]+"), {SMOLLM2_EOS})
    grammar.sync([ids["a"], ids["b"], ids["a"]])
    assert grammar.num_accepted == 3
    grammar.sync([ids["a"]])
    assert grammar.num_accepted == 1 and SMOLLM2_EOS in allowed(grammar)
    with pytest.raises(RuntimeError, match="refused token"):
        grammar.sync([ids["a"], ids["1"]])


def sequence(tokenizer, compiler, output_ids, **fields):
    seq = build_sequence(pb.GenerateRequest(text="x", **fields), LIMITS, tokenizer)
    if seq.grammar_spec is not None:
        seq.grammar = grammar_for(compiler, seq.grammar_spec, seq.stop_token_ids)
    for token_id in output_ids:
        seq.append(SampledToken(token_id))
    return seq


@pytest.mark.parametrize("with_kernel", [False, True], ids=["xgrammar", "dpgate-kernel"])
@pytest.mark.e2e  # compiles in the grammar compiler's child process
def test_one_bitmask_masks_the_constrained_rows_exactly_and_leaves_the_rest_alone(
    smollm2_compiler, smollm2_tokenizer, ids, with_kernel
):
    seqs = [
        sequence(smollm2_tokenizer, smollm2_compiler, [], structured_output=pb.StructuredOutput(regex="[0-9]+")),
        sequence(smollm2_tokenizer, smollm2_compiler, []),
        sequence(
            smollm2_tokenizer,
            smollm2_compiler,
            [ids['"']],
            structured_output=pb.StructuredOutput(json_schema='{"type": "string"}'),
        ),
    ]
    logits = torch.randn(3, SMOLLM2_VOCAB_SIZE, generator=torch.Generator().manual_seed(0))
    before = logits.clone()
    buffers = MaskBuffers()  # used by an earlier, wider step first: nothing of it may leak
    wider = torch.full((3, SMOLLM2_VOCAB_SIZE), 7.0)
    mask_constrained_rows(wider, [seqs[2], seqs[0], seqs[2]], buffers, with_kernel=with_kernel)
    masked = mask_constrained_rows(logits, seqs, buffers, with_kernel=with_kernel)
    assert torch.equal(logits, before) and masked.index == {0: 0, 2: 1} and not masked.conflicts
    for row, grammar in ((0, seqs[0].grammar), (2, seqs[2].grammar)):
        keep = torch.zeros(SMOLLM2_VOCAB_SIZE, dtype=torch.bool)
        keep[sorted(allowed(grammar))] = True
        expected = torch.where(keep, logits[row], torch.tensor(float("-inf")))
        assert torch.equal(masked.logits[masked.index[row]], expected)  # bits kept, -inf elsewhere


@pytest.mark.e2e  # compiles in the grammar compiler's child process
def test_a_stop_token_the_grammar_requires_next_empties_the_mask_with_a_clear_error(
    smollm2_compiler, smollm2_tokenizer, ids
):
    regex = pb.StructuredOutput(regex="ab")
    conflicted = sequence(
        smollm2_tokenizer,
        smollm2_compiler,
        [ids["a"]],
        structured_output=regex,
        stopping=pb.StoppingCriteria(stop_token_ids=[ids["b"]], max_tokens=8),
    )
    fine = sequence(smollm2_tokenizer, smollm2_compiler, [ids["a"]], structured_output=regex)
    masked = mask_constrained_rows(torch.zeros(2, SMOLLM2_VOCAB_SIZE), [conflicted, fine], MaskBuffers())
    assert list(masked.conflicts) == [0]
    message = str(masked.conflicts[0])
    assert "after 1 generated tokens the grammar can only continue with token(s)" in message
    assert f"[{ids['b']}], which are stop tokens of this request" in message
    assert torch.isfinite(masked.logits[masked.index[1]][ids["b"]])


@pytest.mark.e2e  # compiles in the grammar compiler's child process
def test_min_tokens_that_block_the_only_allowed_stop_tokens_name_min_tokens(smollm2_compiler, smollm2_tokenizer, ids):
    seq = sequence(
        smollm2_tokenizer,
        smollm2_compiler,
        [ids["a"]],
        structured_output=pb.StructuredOutput(regex="a"),
        stopping=pb.StoppingCriteria(min_tokens=3, max_tokens=8),
    )
    masked = mask_constrained_rows(torch.zeros(1, SMOLLM2_VOCAB_SIZE), [seq], MaskBuffers())
    assert "conflicts with stopping.min_tokens" in str(masked.conflicts[0])
    assert "min_tokens is 3" in str(masked.conflicts[0])


def test_clear_bits_handles_the_sign_bit_of_an_int32_word():
    row = torch.full((2,), -1, dtype=torch.int32)
    clear_bits(row, [31, 32, 0])
    assert allowed_token_ids(row, 64) == [t for t in range(64) if t not in (0, 31, 32)]


def test_clearing_many_rows_at_once_clears_exactly_the_named_bits():
    """Several tokens of one word, the sign bit, repeats and rows without any: against a bit-by-bit reference."""
    generator = torch.Generator().manual_seed(3)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (4, 6), dtype=torch.int32, generator=generator)
    cleared = [(0, [0, 1, 31, 31]), (2, [32, 63, 64, 191]), (0, [95]), (3, [])]
    expected = {row: set(allowed_token_ids(bitmask[row], 192)) for row in range(4)}
    for row, token_ids in cleared:
        expected[row] -= set(token_ids)
    clear_bits_of_rows(bitmask.numpy(), cleared)
    assert {row: set(allowed_token_ids(bitmask[row], 192)) for row in range(4)} == expected
