import pytest

from gateway.handshake import EngineIdentity, RefusalReason, check_engine


def identity(address, rank, size=2, model="m"):
    return EngineIdentity(address=address, rank=rank, data_parallel_size=size, model=model)


def test_first_engine_is_accepted():
    assert check_engine(identity("a", 1), []) is None


@pytest.mark.parametrize(
    ("candidate", "reason", "text"),
    [
        (identity("b", 1, size=3), RefusalReason.DP_SIZE_MISMATCH, "size 3 but connected engines report 2"),
        (identity("b", 0), RefusalReason.DUPLICATE_RANK, "rank 0, already served by a"),
        (identity("b", 2), RefusalReason.RANK_OUT_OF_RANGE, "rank 2, outside 0..1"),
        (identity("b", 1, model="x"), RefusalReason.MODEL_MISMATCH, "serves model 'x'"),
        (identity("b", 0, size=0), RefusalReason.INVALID_DP_SIZE, "size 0"),
    ],
)
def test_refusals(candidate, reason, text):
    refusal = check_engine(candidate, [identity("a", 0)])
    assert refusal is not None
    assert refusal.reason is reason
    assert text in refusal.message
    assert refusal.message.startswith("engine b ")


def test_rank_out_of_range_even_alone():
    refusal = check_engine(identity("a", 4, size=2), [])
    assert refusal is not None and refusal.reason is RefusalReason.RANK_OUT_OF_RANGE


def test_restarted_engine_replaces_itself():
    accepted = [identity("a", 0), identity("b", 1)]
    assert check_engine(identity("a", 0), accepted) is None
    refusal = check_engine(identity("a", 1), accepted)
    assert refusal is not None and refusal.reason is RefusalReason.DUPLICATE_RANK


def test_an_engine_whose_tokenizer_differs_is_refused_with_both_fingerprints():
    first = EngineIdentity("a", 0, 2, "m", tokenizer_fingerprint="aa" * 32)
    odd = EngineIdentity("b", 1, 2, "m", tokenizer_fingerprint="bb" * 32)
    refusal = check_engine(odd, [first])
    assert refusal is not None and refusal.reason is RefusalReason.TOKENIZER_MISMATCH
    assert "bbbbbbbbbbbbbbbb" in refusal.message and "aaaaaaaaaaaaaaaa" in refusal.message
    same = EngineIdentity("b", 1, 2, "m", tokenizer_fingerprint="aa" * 32)
    assert check_engine(same, [first]) is None
