"""The project's target ratios (issue 5), checked against one run's measurements.

| goal | held when |
| --- | --- |
| throughput vs tuned | split RPS >= 1.5 x tuned in-process RPS |
| throughput vs ceiling | split RPS >= 0.6 x the ceiling's RPS |
| throughput vs naive | split RPS >= 50 x naive RPS |
| tail latency | split p99 <= 0.25 x tuned p99 at the reference load (80 % of tuned's RPS) |
| memory vs naive | split total PSS <= 0.6 x naive's, at the same API worker count (1 and 4) |
| memory vs tuned | split total PSS <= 0.9 x tuned's, at the same API worker count (1 and 4) |
| memory per worker | (split PSS at 4 workers - at 1) / 3 <= 40 MB |

A goal that could not be measured in the run (a setup failed or was skipped, a load
was not reached) is reported with `held=None`, never as met.
"""

from __future__ import annotations

from bench.results import BenchResults, Goal, SetupResult

RPS_VS_TUNED = 1.5
RPS_VS_CEILING = 0.6
RPS_VS_NAIVE = 50.0
P99_VS_TUNED = 0.25
PSS_VS_NAIVE = 0.6
PSS_VS_TUNED = 0.9
MB_PER_ADDED_WORKER = 40.0
MEMORY_WORKERS = (1, 4)


def _ratio_goal(name: str, target: str, num: float | None, den: float | None, bound: float,
                *, at_least: bool, unit: str, why_missing: str) -> Goal:
    if num is None or den is None or den <= 0:
        return Goal(name, target, "not measured", None, why_missing)
    ratio = num / den
    held = ratio >= bound if at_least else ratio <= bound
    return Goal(name, target, f"{num:,.1f} / {den:,.1f} {unit} = {ratio:.2f}x", held)


def _missing(*setups: tuple[str, SetupResult | None]) -> str:
    gone = [
        f"{label}: {s.status if s else 'not run'}{' (' + s.reason + ')' if s and s.reason else ''}"
        for label, s in setups
        if s is None or s.status != "ok"
    ]
    return "; ".join(gone)


def evaluate(results: BenchResults) -> list[Goal]:
    """Every goal above, for the best split variant of `results`."""
    split = results.best_split()
    naive, tuned, ceiling = (results.column(c) for c in ("naive", "tuned", "ceiling"))
    label = f"split ({split.name})" if split and split.rps is not None else "split"
    goals = [
        _ratio_goal("throughput vs tuned", f"{label} RPS >= {RPS_VS_TUNED}x tuned RPS",
                    split and split.rps, tuned and tuned.rps, RPS_VS_TUNED, at_least=True,
                    unit="RPS", why_missing=_missing(("split", split), ("tuned", tuned))),
        _ratio_goal("throughput vs ceiling", f"{label} RPS >= {RPS_VS_CEILING:.0%} of ceiling RPS",
                    split and split.rps, ceiling and ceiling.rps, RPS_VS_CEILING, at_least=True,
                    unit="RPS", why_missing=_missing(("split", split), ("ceiling", ceiling))),
        _ratio_goal("throughput vs naive", f"{label} RPS >= {RPS_VS_NAIVE:g}x naive RPS",
                    split and split.rps, naive and naive.rps, RPS_VS_NAIVE, at_least=True,
                    unit="RPS", why_missing=_missing(("split", split), ("naive", naive))),
    ]

    split_ref = split.load_at(reference=True) if split else None
    tuned_ref = tuned.load_at(reference=True) if tuned else None
    ref = f"{results.reference_rps:,.0f} RPS" if results.reference_rps else "80% of tuned's RPS"
    split_p99 = split_ref.result.latency.p99_ms if split_ref and split_ref.result.latency else None
    tuned_p99 = tuned_ref.result.latency.p99_ms if tuned_ref and tuned_ref.result.latency else None
    p99_goal = _ratio_goal(
        "tail latency", f"{label} p99 <= {P99_VS_TUNED}x tuned p99 at {ref}",
        split_p99, tuned_p99, P99_VS_TUNED, at_least=False, unit="ms",
        why_missing=_missing(("split", split), ("tuned", tuned))
        or "no run at the reference load",
    )
    if split_ref and not split_ref.result.schedule_kept and p99_goal.held is not None:
        p99_goal = Goal(p99_goal.name, p99_goal.target, p99_goal.measured, False,
                        "split could not keep up with the reference load")
    goals.append(p99_goal)

    for workers in MEMORY_WORKERS:
        split_mem = split.memory_at(workers) if split else None
        for other_name, other, bound in (
            ("naive", naive, PSS_VS_NAIVE),
            ("tuned", tuned, PSS_VS_TUNED),
        ):
            other_mem = other.memory_at(workers) if other else None
            goals.append(_ratio_goal(
                f"memory vs {other_name} @{workers}w",
                f"{label} PSS <= {bound:.0%} of {other_name} PSS at {workers} API worker(s)",
                split_mem and split_mem.pss_mb, other_mem and other_mem.pss_mb, bound,
                at_least=False, unit="MB",
                why_missing=_missing(("split", split), (other_name, other))
                or f"memory at {workers} worker(s) not measured",
            ))

    one = split.memory_at(1) if split else None
    four = split.memory_at(4) if split else None
    target = f"{label}: each added API worker <= {MB_PER_ADDED_WORKER:g} MB PSS"
    if one and four:
        per_worker = (four.pss_mb - one.pss_mb) / 3
        goals.append(Goal("memory per worker", target,
                          f"({four.pss_mb:,.1f} - {one.pss_mb:,.1f}) / 3 = {per_worker:,.1f} MB",
                          per_worker <= MB_PER_ADDED_WORKER))
    else:
        goals.append(Goal("memory per worker", target, "not measured", None,
                          _missing(("split", split)) or "memory at 1 and 4 workers not measured"))
    return goals
