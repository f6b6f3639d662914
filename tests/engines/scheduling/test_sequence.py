"""Stop rules live where tokens are produced: the sequence ends and hides stop text itself."""

from __future__ import annotations

from engines.sampling.params import SamplingParams, StoppingParams
from engines.sampling.tokens import SampledToken
from engines.scheduling.sequence import FinishReason, Sequence

EOS = 2


def make_sequence(tokenizer, stopping: StoppingParams, extra_stop_ids=()) -> Sequence:
    return Sequence(
        request_id="r",
        prompt_ids=tokenizer("Prompt:").input_ids,
        sampling=SamplingParams(temperature=0.0),
        stopping=stopping,
        stop_token_ids=frozenset({EOS, *extra_stop_ids}),
        decoder=tokenizer,
    )


def feed(seq: Sequence, token_ids: list[int]):
    outputs = []
    for token_id in token_ids:
        outputs.append(seq.append(SampledToken(token_id)))
        if seq.is_finished:
            break
    return outputs


def test_a_stop_token_ends_the_request_and_is_reported(smollm2_tokenizer):
    seq = make_sequence(smollm2_tokenizer, StoppingParams(max_tokens=50))
    outputs = feed(seq, [*smollm2_tokenizer(" Hi there").input_ids, EOS, 42])
    assert outputs[-1].finish_reason is FinishReason.STOP
    assert outputs[-1].stop_token_id == EOS and outputs[-1].stop_string is None
    assert "".join(o.text for o in outputs) == " Hi there"
    assert outputs[-1].num_generated_tokens == len(seq.output_ids) == 3


def test_a_stop_string_across_tokens_is_cut_and_never_streamed(smollm2_tokenizer):
    seq = make_sequence(smollm2_tokenizer, StoppingParams(max_tokens=50, stop=("END",)))
    outputs = feed(seq, smollm2_tokenizer(" one two. EN D? no: END three").input_ids)
    text = "".join(o.text for o in outputs)
    assert text == " one two. EN D? no: "
    assert outputs[-1].finish_reason is FinishReason.STOP and outputs[-1].stop_string == "END"
    assert all("END" not in o.text for o in outputs)


def test_text_that_may_begin_a_stop_string_is_held_then_released(smollm2_tokenizer):
    seq = make_sequence(smollm2_tokenizer, StoppingParams(max_tokens=50, stop=("\n\n",)))
    newline, word = smollm2_tokenizer("\n").input_ids, smollm2_tokenizer("x").input_ids
    assert feed(seq, newline)[0].text == ""  # could be the start of "\n\n"
    assert feed(seq, word)[0].text == "\nx"


def test_max_tokens_ends_with_length(smollm2_tokenizer):
    seq = make_sequence(smollm2_tokenizer, StoppingParams(max_tokens=3))
    outputs = feed(seq, smollm2_tokenizer(" a b c d e").input_ids)
    assert len(outputs) == 3 and outputs[-1].finish_reason is FinishReason.LENGTH


def test_min_tokens_blocks_stop_tokens_and_ignores_stop_strings_until_reached(smollm2_tokenizer):
    seq = make_sequence(smollm2_tokenizer, StoppingParams(max_tokens=20, min_tokens=3, stop=("a",)))
    assert seq.blocked_token_ids == [EOS]
    outputs = feed(seq, smollm2_tokenizer("a b").input_ids)  # "a" within the first 3 tokens: kept
    assert not seq.is_finished
    assert seq.blocked_token_ids == [] if len(seq.output_ids) >= 3 else [EOS]
    outputs += feed(seq, smollm2_tokenizer(" c a").input_ids)
    assert seq.finish_reason is FinishReason.STOP and seq.stop_string == "a"
    assert "".join(o.text for o in outputs) == "a b c "


def test_abort_ends_with_aborted(smollm2_tokenizer):
    seq = make_sequence(smollm2_tokenizer, StoppingParams(max_tokens=5))
    assert seq.abort().finish_reason is FinishReason.ABORTED


def test_user_stop_token_ids_stop_like_eos(smollm2_tokenizer):
    seq = make_sequence(smollm2_tokenizer, StoppingParams(max_tokens=5), extra_stop_ids=[42])
    outputs = feed(seq, [100, 42])
    assert outputs[-1].stop_token_id == 42
