"""The project's targets, checked against one run: ratios within the run, same CPU budget.

"split" is the headline split, the product's default (`run-server.sh` with nothing set);
SLO-RPS is the median of a setup's searches (`bench.slo.spread`) of the highest Poisson
rate with p99 <= the workload's SLO, no errors, schedule kept. "peers" are the `peer`
setups (BentoML, Ray Serve).

| goal | held when |
| --- | --- |
| SLO-RPS vs tuned | split SLO-RPS >= 1.0 x tuned SLO-RPS (fraud) |
| SLO-RPS vs ceiling | split SLO-RPS >= 0.75 x the ceiling's SLO-RPS (fraud) |
| median at low load | split p50 <= tuned p50 + 0.5 ms, at 10 % of tuned's SLO-RPS (fraud) |
| heavier model | split SLO-RPS >= 2.5 x tuned SLO-RPS (fraud-transformer) |
| heavier model vs peers | split SLO-RPS >= the best peer's SLO-RPS (fraud-transformer) |
| heavier model, 1-CPU limit | no target: the split's share of the limit `one_cpu_limit` estimates |
| memory vs peers | split total PSS at 4 API workers <= 0.6 x the lightest peer's at 4 workers/replicas |
| memory vs naive | split total PSS <= 0.6 x naive's, at the same API worker count (1 and 4) |
| memory vs tuned | split total PSS <= 0.9 x tuned's, at the same API worker count (1 and 4) |
| memory per worker | (split PSS at 4 workers - at 1) / 3 <= 40 MB |

A goal that could not be measured in the run (a setup failed or was skipped, a rate not
reached, a workload not run) is reported with `held=None`, never as met. A tuned that
never meets the SLO makes the SLO-RPS ratios unmeasurable, not held.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from bench.results import BenchResults, Goal, SetupResult

SLO_RPS_VS_TUNED = 1.0
SLO_RPS_VS_CEILING = 0.75
P50_OVER_TUNED_MS = 0.5
HEAVY_SLO_RPS_VS_TUNED = 2.5
HEAVY_VS_BEST_PEER = 1.0
PSS_VS_PEER_AT_4 = 0.6
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
    if not why and other is not None and other.workload_slo_rps is None:
        why = f"{other_column} never met the SLO"
    goal = _ratio(name, target, split and split.workload_slo_rps, other and other.workload_slo_rps, bound,
                  at_least=True, unit="RPS", why_missing=why)
    if goal.held is None and not why and split is not None and split.workload_slo_rps is None:
        return Goal(name, target, "split never met the SLO", False)
    if goal.held and split is not None and split.slo_bound_reached:
        return Goal(goal.name, goal.target, goal.measured, goal.held,
                    "the search that gives split's median never failed: at least this")
    return goal


def _at_tuned_rate(results: BenchResults, share: float, attr: str) -> tuple[
        float | None, float | None, str]:
    """(split's, tuned's) `attr` at `share` x tuned's SLO-RPS, and why one is missing."""
    split, tuned = (results.column(MAIN_WORKLOAD, c) for c in ("split", "tuned"))
    why = _missing(("split", split), ("tuned", tuned))
    if why:
        return None, None, why
    assert split is not None and tuned is not None
    if tuned.workload_slo_rps is None:
        return None, None, "tuned never met the SLO"
    rate = share * tuned.workload_slo_rps
    ours, theirs = split.point_at(rate), tuned.point_at(rate)
    if ours is None or theirs is None:
        return None, None, f"no step at {rate:,.0f} RPS"
    return getattr(ours, attr), getattr(theirs, attr), ""


def peers(results: BenchResults, workload: str) -> list[SetupResult]:
    """The peer setups of `workload` that ran."""
    return [s for s in results.setups if s.workload == workload and s.column == "peer"]


def _vs_best_peer(results: BenchResults) -> Goal:
    name, target = "heavier model vs peers", f"split SLO-RPS >= the best peer's SLO-RPS ({HEAVY_WORKLOAD})"
    split = results.column(HEAVY_WORKLOAD, "split")
    measured = [p for p in peers(results, HEAVY_WORKLOAD) if p.status == "ok"]
    if split is None or split.status != "ok" or not measured:
        missing = _missing(("split", split)) or "no peer measured: " + "; ".join(
            f"{p.name}: {p.status} ({p.reason})" for p in peers(results, HEAVY_WORKLOAD)) or "no peer in the run"
        return Goal(name, target, "not measured", None, missing)
    best = max(measured, key=lambda p: p.workload_slo_rps or 0.0)
    if not best.workload_slo_rps:
        return Goal(name, target, "no peer met the SLO", split.workload_slo_rps is not None)
    return _ratio(name, target.replace("the best peer's", f"the best peer's ({best.name})"),
                  split.workload_slo_rps or 0.0, best.workload_slo_rps, HEAVY_VS_BEST_PEER, at_least=True, unit="RPS",
                  why_missing="")


def _memory_vs_peers(results: BenchResults) -> Goal:
    name = "memory vs peers @4w"
    target = f"split PSS at 4 API workers <= {PSS_VS_PEER_AT_4:.0%} of the lightest peer's at 4"
    split = results.column(MAIN_WORKLOAD, "split")
    mine = split.memory_at(4) if split else None
    theirs = [(p.name, m.pss_mb) for p in peers(results, MAIN_WORKLOAD) if (m := p.memory_at(4))]
    if mine is None or not theirs:
        return Goal(name, target, "not measured", None,
                    "split or every peer has no memory at 4 workers in this run")
    lightest, mb = min(theirs, key=lambda item: item[1])
    return _ratio(name, target.replace("the lightest peer's", f"the lightest peer's ({lightest})"),
                  mine.pss_mb, mb, PSS_VS_PEER_AT_4, at_least=False, unit="MB", why_missing="")


@dataclass(frozen=True)
class CpuLimit:
    """The estimated 1-CPU limit of a model behind an API, requests/s (see `one_cpu_limit`)."""

    rps: float
    batch: int  # the batch size it assumes
    model_ms_per_row: float  # in-process, at that batch size
    api_ms_per_request: float


def one_cpu_limit(batch_ms: Mapping[int, float], api_ms_per_request: float, slo_ms: float) -> CpuLimit | None:
    """What one CPU can serve of a model behind an API within `slo_ms`, estimated.

    Every request costs the API `api_ms_per_request` of CPU and its row `t(b) / b`, where
    `t(b)` is the model's in-process time for a batch of b rows (`bench.model_cost`). A
    batch is gathered while the one before it runs, so a request waits up to one round,
    `t(b) + b * api_ms_per_request`, then its own: the largest measured b whose two rounds fit
    in the SLO is the batch size the SLO allows, and `b / round` the limit. None when not
    even one row fits.
    """
    best: CpuLimit | None = None
    for batch, ms in sorted(batch_ms.items()):
        round_ms = ms + batch * api_ms_per_request
        if 2 * round_ms > slo_ms:
            continue
        limit = CpuLimit(1000.0 * batch / round_ms, batch, ms / batch, api_ms_per_request)
        if best is None or limit.rps > best.rps:
            best = limit
    return best


def api_cost_ms(results: BenchResults) -> float | None:
    """The API's CPU per request, ms: the ceiling's (the split's API, no model) setup CPU at
    its SLO-RPS step divided by that rate (fraud workload: the same API and route)."""
    ceiling = results.column(MAIN_WORKLOAD, "ceiling")
    at = ceiling.at_slo() if ceiling else None
    if at is None or at.cpu is None or not at.offered_rps:
        return None
    return 1000.0 * at.cpu.setup_cores / at.offered_rps


def _one_cpu_goal(results: BenchResults) -> Goal:
    name, target = "heavier model, 1-CPU limit", "no target: how close the split gets to the estimate"
    cost = results.meta.get("model_cost", {}).get(HEAVY_WORKLOAD, {})
    batch_ms = {int(b): float(ms) for b, ms in cost.get("batch_ms", {}).items()}
    api_ms = api_cost_ms(results)
    slo = results.slo_ms(HEAVY_WORKLOAD)
    split = results.column(HEAVY_WORKLOAD, "split")
    if not batch_ms or api_ms is None or slo is None:
        return Goal(name, target, "not measured", None,
                    "needs the model's cost by batch size and the ceiling's CPU per request")
    limit = one_cpu_limit(batch_ms, api_ms, slo)
    if limit is None:
        return Goal(name, target, f"not even one row fits twice in {slo:g} ms", None)
    how = (f"1000 x {limit.batch} / ({limit.model_ms_per_row * limit.batch:.2f} ms for {limit.batch} rows "
           f"+ {limit.batch} x {api_ms:.3f} ms of API per request) = {limit.rps:,.0f} RPS")
    got = split.workload_slo_rps if split and split.status == "ok" else None
    shown = f"{how}; split {got:,.0f} = {got / limit.rps:.0%} of it" if got else f"{how}; split not measured"
    return Goal(name, target, shown, None, "an estimate, not a target")


def evaluate(results: BenchResults) -> list[Goal]:
    """Every goal above for the run's headline split."""
    goals = [
        _slo_rps_goal("SLO-RPS vs tuned", results, MAIN_WORKLOAD, "tuned", SLO_RPS_VS_TUNED),
        _slo_rps_goal("SLO-RPS vs ceiling", results, MAIN_WORKLOAD, "ceiling", SLO_RPS_VS_CEILING),
    ]
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
    goals.append(_vs_best_peer(results))
    goals.append(_one_cpu_goal(results))
    goals.append(_memory_vs_peers(results))

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
