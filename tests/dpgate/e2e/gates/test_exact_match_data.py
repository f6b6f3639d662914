"""The exact-match gate's bundled data and its normalisation, without a server."""

from __future__ import annotations

import datetime

import pytest

from dpgate.e2e.gates import exact_match


@pytest.mark.parametrize(
    ("raw", "normalised"),
    [(" Paris.", "paris"), ("  William   Shakespeare!\n", "william shakespeare"), ("7 ?", "7"), ("H2O", "h2o")],
)
def test_normalise_strips_case_and_trailing_punctuation(raw, normalised):
    assert exact_match.normalise(raw) == normalised


def test_normalise_keeps_what_makes_an_answer_wrong():
    assert exact_match.normalise(" 7 days") != exact_match.normalise("7")
    assert exact_match.normalise("The Sun") != exact_match.normalise("Sun")
    assert exact_match.normalise("2.5") != exact_match.normalise("25")


def test_the_question_set_is_bundled_well_formed_and_apart_from_the_examples():
    data = exact_match.load_data()
    items = exact_match.questions(data)
    assert 40 <= len(items) <= 60
    asked = [item.question for item in items]
    assert len(set(asked)) == len(asked)
    assert all(item.answer.strip() and exact_match.normalise(item.answer) for item in items)
    assert not {q for q, _ in exact_match.EXAMPLES} & set(asked)


@pytest.mark.parametrize("model", ["smollm2-135m-instruct", "gemma3-270m"])
def test_each_served_model_has_a_dated_baseline_and_a_threshold_at_most_its_score(model):
    baseline = exact_match.load_data()["baselines"][model]
    assert baseline["style"] in exact_match.STYLES
    assert 0 < baseline["threshold"] <= baseline["correct"] <= baseline["questions"]
    # Both styles were measured (None: the style cannot run on that model) and the best one kept.
    assert set(baseline["scores"]) == set(exact_match.STYLES)
    measured = [score for score in baseline["scores"].values() if score is not None]
    assert baseline["scores"][baseline["style"]] == baseline["correct"] == max(measured)
    datetime.date.fromisoformat(baseline["measured"])
    assert baseline["how"]
