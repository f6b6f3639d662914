import pytest

from gateway.errors import InvalidArgument
from gateway.metadata import RANK_ERROR_MESSAGE, parse_data_parallel_rank, parse_rank_value
from tests.gateway.rank_corpus import GOOD, KEY, SENDABLE_BAD, UNSENDABLE_BAD

ALL_BAD = SENDABLE_BAD + UNSENDABLE_BAD


def test_corpus_is_large_enough():
    assert len(SENDABLE_BAD) >= 30


@pytest.mark.parametrize(("name", "metadata"), ALL_BAD, ids=[name for name, _ in ALL_BAD])
def test_bad_values_fail_with_the_exact_message(name, metadata):
    with pytest.raises(InvalidArgument) as info:
        parse_data_parallel_rank(metadata)
    assert info.value.message == RANK_ERROR_MESSAGE
    assert str(info.value) == "x-data-parallel-rank metadata must be an unsigned 32-bit integer"


@pytest.mark.parametrize(("value", "rank"), GOOD)
def test_good_values(value, rank):
    assert parse_data_parallel_rank([("user-agent", "x"), (KEY, value)]) == rank


@pytest.mark.parametrize("value", ["\t1", "1\n", "\r\n2\f", "\v5 "])
def test_ascii_whitespace_is_stripped(value):
    assert parse_rank_value(value) in {1, 2, 5}


def test_ascii_bytes_value_is_accepted():
    assert parse_rank_value(b" 12 ") == 12


@pytest.mark.parametrize("metadata", [None, (), [("user-agent", "x")], [("x-data-parallel-ranks", "z")]])
def test_absent_means_no_pin(metadata):
    assert parse_data_parallel_rank(metadata) is None


def test_keys_compare_lower_cased():
    assert parse_data_parallel_rank([("X-Data-Parallel-Rank", "2")]) == 2
