"""How a shadow's answer compares with the primary's: numeric differences and class agreement.

Pure. Both answers are the route's own response model (its `postprocess` run on each model's
outputs), so what is compared is what the caller would have seen, field by field (top-level
fields of the response; the `model` field, which names the servable, is left out):

- a number (float, not bool): the absolute difference;
- a list of numbers (e.g. class probabilities): the largest absolute difference element-wise
  (lists of other lengths are not comparable: skipped);
- a bool, an int, a str or an enum (a class, a flag such as `is_fraud`, a label): agreement,
  equal or not;
- anything else (nested objects, None on either side): skipped.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

#: Response fields never compared: the servable that answered differs by design.
IGNORED_FIELDS = frozenset({"model"})


@dataclass(frozen=True, slots=True)
class Comparison:
    """Field name -> absolute difference (numbers) and field name -> equal (classes)."""

    differences: Mapping[str, float]
    agreements: Mapping[str, bool]

    def as_json(self) -> dict[str, Any]:
        """`{"differences": {...}, "agreements": {...}}` (for the shadow's score event)."""
        return {"differences": dict(self.differences), "agreements": dict(self.agreements)}


def compare_answers(primary: BaseModel, shadow: BaseModel) -> Comparison:
    """Compare two answers of the same response model (see module doc)."""
    differences: dict[str, float] = {}
    agreements: dict[str, bool] = {}
    theirs = dict(shadow)
    for name, mine in dict(primary).items():
        if name in IGNORED_FIELDS or name not in theirs:
            continue
        other = theirs[name]
        if _is_number(mine) and _is_number(other):
            differences[name] = _difference(float(mine), float(other))
        elif _numbers(mine) and _numbers(other) and len(mine) == len(other):
            differences[name] = max(
                (_difference(float(a), float(b)) for a, b in zip(mine, other, strict=True)), default=0.0
            )
        elif _is_class(mine) and _is_class(other):
            agreements[name] = mine == other
    return Comparison(differences, agreements)


def _is_number(value: object) -> bool:
    """A float: a score, a probability. An int is a class (a digit, a count bucket)."""
    return isinstance(value, float)


def _numbers(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in value
    )


def _is_class(value: object) -> bool:
    return isinstance(value, (bool, int, str, enum.Enum))


def _difference(a: float, b: float) -> float:
    """|a - b|; inf when exactly one is not finite, 0 when both are the same non-finite value."""
    if math.isfinite(a) and math.isfinite(b):
        return abs(a - b)
    return 0.0 if a == b or (math.isnan(a) and math.isnan(b)) else math.inf
