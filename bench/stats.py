"""The benchmark's one percentile rule and latency summary, pure functions.

Every latency figure of `python -m bench` and `python -m bench.serving_tier` goes through
`percentile` (nearest rank: the smallest value with at least p % of the values at or
below it), so two reports never disagree because they rounded a rank differently.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of ascending values.

    Args:
        sorted_values: ascending, not empty.
        p: in (0, 100].

    Raises:
        ValueError: empty input or p out of range.
    """
    if not sorted_values:
        raise ValueError("percentile of no values")
    if not 0 < p <= 100:
        raise ValueError(f"percentile {p} not in (0, 100]")
    # round() first: 99.9 / 100 * 1000 is 999.0000000000001 in floating point, not 999.
    rank = math.ceil(round(p / 100 * len(sorted_values), 9))
    return float(sorted_values[max(rank, 1) - 1])


@dataclass(frozen=True)
class LatencySummary:
    """Latency of a set of requests, milliseconds."""

    count: int
    avg_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float


def summarize_ms(samples_ms: Sequence[float]) -> LatencySummary | None:
    """avg, p50, p90, p99, p99.9 and max of latencies in milliseconds (None if empty)."""
    if not samples_ms:
        return None
    values = sorted(samples_ms)
    return LatencySummary(
        count=len(values),
        avg_ms=sum(values) / len(values),
        p50_ms=percentile(values, 50),
        p90_ms=percentile(values, 90),
        p99_ms=percentile(values, 99),
        p999_ms=percentile(values, 99.9),
        max_ms=values[-1],
    )
