"""The project's targets, checked against one run: ratios within the run, same CPU budget.

"split" is the headline split, the product's default (`run-server.sh` with nothing set);
SLO-RPS is the highest Poisson rate with p99 <= the SLO, no errors, schedule kept.

| goal | held when |
| --- | --- |
| SLO-RPS vs tuned | split SLO-RPS >= 2 x tuned SLO-RPS (fraud) |
| SLO-RPS vs ceiling | split SLO-RPS >= 0.6 x the ceiling's SLO-RPS (fraud) |
| tail at tuned's SLO-RPS | split p99 <= 0.5 x tuned p99, both at tuned's SLO-RPS (fraud) |
| median at low load | split p50 <= tuned p50 + 1 ms, at 10 % of tuned's SLO-RPS (fraud) |
| heavier model | split SLO-RPS >= 4 x tuned SLO-RPS (fraud-transformer) |
| memory vs naive | split total PSS <= 0.6 x naive's, at the same API worker count (1 and 4) |
| memory vs tuned | split total PSS <= 0.9 x tuned's, at the same API worker count (1 and 4) |
| memory per worker | (split PSS at 4 workers - at 1) / 3 <= 40 MB |

A goal that could not be measured in the run (a setup failed or was skipped, a rate not
reached, a workload not run) is reported with `held=None`, never as met. A tuned that
never meets the SLO makes the SLO-RPS ratios unmeasurable, not held.
"""

from __future__ import annotations

from bench.results import BenchResults, Goal, SetupResult

SLO_RPS_VS_TUNED = 2.0
SLO_RPS_VS_CEILING = 0.6
P99_VS_TUNED = 0.5
P50_OVER_TUNED_MS = 1.0
HEAVY_SLO_RPS_VS_TUNED = 4.0
PSS_VS_NAIVE = 0.6
PSS_VS_TUNED = 0.9
MB_PER_ADDED_WORKER = 40.0
MEMORY_WORKERS = (1, 4)
MAIN_WORKLOAD = "fraud"
HEAVY_WORKLOAD = "fraud-transformer"


def _missing(*setups: tuple[str, SetupResult | None]) -> str:
    gone = [
        f"{label}: {s.status if s else 'not run'}{' (' + s.reason + ')' if s and s.reason else ''}"
        for label, s in setups
        if s is None or s.status != "ok"
    ]
    return "; ".join(gone)


def _ratio(name: str, target: str, num: float | None, den: float | None, bound: float, *,
           at_least: bool, unit: str, why_missing: str) -> Goal:
    if num is None or den is None or den <= 0:
        return Goal(name, target, "not measured", None, why_missing)
    ratio = num / den
    held = ratio >= bound if at_least else ratio <= bound
    return Goal(name, target, f"{num:,.1f} / {den:,.1f} {unit} = {ratio:.2f}x", held)


def _slo_rps_goal(name: str, results: BenchResults, workload: str, other_column: str,
                  bound: float) -> Goal:
    split, other = results.column(workload, "split"), results.column(workload, other_column)
    target = f"split SLO-RPS >= {bound:g}x {other_column} SLO-RPS ({workload})"
    why = _missing(("split", split), (other_column, other))
    if not why and other is not None and other.slo_rps is None:
        why = f"{other_column} never met the SLO"
    goal = _ratio(name, target, split and split.slo_rps, other and other.slo_rps, bound,
                  at_least=True, unit="RPS", why_missing=why)
    if goal.held is None and not why and split is not None and split.slo_rps is None:
        return Goal(name, target, "split never met the SLO", False)
    if goal.held and split is not None and split.slo_bound_reached:
        return Goal(goal.name, goal.target, goal.measured, goal.held,
                    "split met the SLO at every ladder rate: at least this")
    return goal


def _at_tuned_rate(results: BenchResults, share: float, attr: str) -> tuple[
        float | None, float | None, str]:
    """(split's, tuned's) `attr` at `share` x tuned's SLO-RPS, and why one is missing."""
    split, tuned = (results.column(MAIN_WORKLOAD, c) for c in ("split", "tuned"))
    why = _missing(("split", split), ("tuned", tuned))
    if why:
        return None, None, why
    assert split is not None and tuned is not None
    if tuned.slo_rps is None:
        return None, None, "tuned never met the SLO"
    rate = share * tuned.slo_rps
    ours, theirs = split.point_at(rate), tuned.point_at(rate)
    if ours is None or theirs is None:
        return None, None, f"no step at {rate:,.0f} RPS"
    return getattr(ours, attr), getattr(theirs, attr), ""


def evaluate(results: BenchResults) -> list[Goal]:
    """Every goal above for the run's headline split."""
    goals = [
        _slo_rps_goal("SLO-RPS vs tuned", results, MAIN_WORKLOAD, "tuned", SLO_RPS_VS_TUNED),
        _slo_rps_goal("SLO-RPS vs ceiling", results, MAIN_WORKLOAD, "ceiling", SLO_RPS_VS_CEILING),
    ]
    ours, theirs, why = _at_tuned_rate(results, 1.0, "p99_ms")
    goals.append(_ratio("tail at tuned's SLO-RPS", f"split p99 <= {P99_VS_TUNED:g}x tuned p99 at "
                        "tuned's SLO-RPS", ours, theirs, P99_VS_TUNED, at_least=False, unit="ms",
                        why_missing=why))
    ours, theirs, why = _at_tuned_rate(results, 0.1, "p50_ms")
    target = f"split p50 <= tuned p50 + {P50_OVER_TUNED_MS:g} ms at 10 % of tuned's SLO-RPS"
    if ours is None or theirs is None:
        goals.append(Goal("median at low load", target, "not measured", None, why))
    else:
        goals.append(Goal("median at low load", target,
                          f"{ours:.2f} vs {theirs:.2f} ms (+{ours - theirs:.2f})",
                          ours <= theirs + P50_OVER_TUNED_MS))
    goals.append(_slo_rps_goal("heavier model", results, HEAVY_WORKLOAD, "tuned",
                               HEAVY_SLO_RPS_VS_TUNED))

    split = results.column(MAIN_WORKLOAD, "split")
    naive, tuned = (results.column(MAIN_WORKLOAD, c) for c in ("naive", "tuned"))
    for workers in MEMORY_WORKERS:
        split_mem = split.memory_at(workers) if split else None
        for other_name, other, bound in (("naive", naive, PSS_VS_NAIVE),
                                         ("tuned", tuned, PSS_VS_TUNED)):
            other_mem = other.memory_at(workers) if other else None
            goals.append(_ratio(
                f"memory vs {other_name} @{workers}w",
                f"split PSS <= {bound:.0%} of {other_name} PSS at {workers} API worker(s)",
                split_mem and split_mem.pss_mb, other_mem and other_mem.pss_mb, bound,
                at_least=False, unit="MB",
                why_missing=_missing(("split", split), (other_name, other))
                or f"memory at {workers} worker(s) not measured",
            ))
    one = split.memory_at(1) if split else None
    four = split.memory_at(4) if split else None
    target = f"split: each added API worker <= {MB_PER_ADDED_WORKER:g} MB PSS"
    if one and four:
        per_worker = (four.pss_mb - one.pss_mb) / 3
        goals.append(Goal("memory per worker", target,
                          f"({four.pss_mb:,.1f} - {one.pss_mb:,.1f}) / 3 = {per_worker:,.1f} MB",
                          per_worker <= MB_PER_ADDED_WORKER))
    else:
        goals.append(Goal("memory per worker", target, "not measured", None,
                          _missing(("split", split)) or "memory at 1 and 4 workers not measured"))
    return goals
