"""`api.rollouts.compare`: a shadow's answer against the primary's, field by field."""

from __future__ import annotations

import math

from pydantic import BaseModel

from api.model_routes import ModelInfo
from api.rollouts.compare import compare_answers


class Answer(BaseModel):
    transaction_id: str
    fraud_score: float
    is_fraud: bool
    digit: int
    probabilities: list[float]
    model: ModelInfo
    note: dict[str, str] | None = None


def answer(score: float, flagged: bool, digit: int, probabilities: list[float], version: int) -> Answer:
    return Answer(
        transaction_id="t-1", fraud_score=score, is_fraud=flagged, digit=digit,
        probabilities=probabilities, model=ModelInfo(name="fraud", version=version),
    )  # fmt: skip


def test_numbers_differ_classes_agree_and_the_model_is_not_compared() -> None:
    primary = answer(0.25, False, 3, [0.1, 0.9], 1)
    shadow = answer(0.75, True, 3, [0.3, 0.6], 2)
    result = compare_answers(primary, shadow)
    assert result.differences == {"fraud_score": 0.5, "probabilities": 0.30000000000000004}
    assert result.agreements == {"transaction_id": True, "is_fraud": False, "digit": True}
    assert result.as_json() == {"differences": dict(result.differences), "agreements": dict(result.agreements)}


def test_identical_answers_differ_by_nothing() -> None:
    same = answer(0.5, True, 1, [1.0], 1)
    result = compare_answers(same, answer(0.5, True, 1, [1.0], 7))
    assert set(result.differences.values()) == {0.0} and all(result.agreements.values())


def test_non_finite_and_unlike_lists() -> None:
    result = compare_answers(answer(math.nan, False, 0, [0.5], 1), answer(0.5, False, 0, [0.5, 0.5], 1))
    assert result.differences == {"fraud_score": math.inf}  # a list of another length is skipped
