"""Capacity on paper from a benchmark run: pods and cores per tier for a target load and SLO.

    python -m bench.sizing bench/results/latest/results.json --rps 3500 --slo-ms 25
    python -m bench.sizing results.json --requests-per-day 30e6 --peak-factor 10 --slo-ms 25

Inputs, all measured by `make bench` and read from its results.json (setup records with
`name`, `workload`, `column`, `headline`, `status`, `server_cpus`, `latency_curve`):

- which offered rates each setup answered within the SLO: the `latency_curve` points
  (open-loop steps: `offered_rps`, `achieved_rps`, `p99_ms`, `errors`) with p99 at or under
  `--slo-ms` and no errors;
- the CPU each tier spent per request at the highest such rate: that point's `cpu.by_role`
  (cores per process role, from /proc/PID/stat) divided by its `achieved_rps`. Roles named
  `serving...` are the serving tier, the others (gunicorn master, API workers) the API tier;
  for an in-process setup every role is the app.

Then, for the target peak rate R: cores of a tier = R x CPU seconds per request / the
utilisation the pods may run at (`--max-utilization`, default 0.6, the HPAs' target in
deploy/k8s); pods = cores / CPUs per pod (2 for the API, 1 for serving, as deploy/k8s
sizes them), at least 2 per tier (the PodDisruptionBudgets keep one while another moves).

What is assumed, not measured: that CPU per request stays what it was at the measured rate
when the load is spread over more pods at the same per-core rate (each pod then runs at or
below the load it was measured at, so its latency should not exceed the measured p99); the
network hop between pods (loopback in the benchmark) is not in the measured latency.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SECONDS_PER_DAY = 86_400


class SizingError(ValueError):
    """The results file lacks what the sizing needs (a setup, a curve point, per-role CPU)."""


@dataclass(frozen=True)
class Capacity:
    """What one setup was measured to sustain within the SLO, and its CPU per request.

    Attributes:
        setup: the setup's name, e.g. "split" or "split-no-coalescing".
        server_cpus: CPUs the setup's processes were pinned to in the run.
        rps: the highest achieved rate whose step met the SLO, requests/s.
        p99_ms: that step's p99 latency, ms.
        cpu_ms_per_request: tier ("api", "serving" or "app") -> CPU ms per request there.
    """

    setup: str
    server_cpus: int
    rps: float
    p99_ms: float
    cpu_ms_per_request: dict[str, float]


@dataclass(frozen=True)
class TierSize:
    """One tier's share of the target: cores needed and pods of `cpus_per_pod`."""

    tier: str
    cpu_ms_per_request: float
    cores: float
    pods: int
    cpus_per_pod: float


def tier_of(role: str, in_process: bool) -> str:
    """The tier a process role belongs to: "serving", "api", or "app" for in-process setups."""
    if in_process:
        return "app"
    return "serving" if role.lower().startswith("serving") else "api"


def capacity(record: dict[str, Any], slo_ms: float) -> Capacity:
    """The setup's measured capacity within `slo_ms` (see the module doc).

    Raises:
        SizingError: no curve step met the SLO without errors, or that step has no per-role CPU.
    """
    in_process = record.get("column") != "split"
    passing = [
        p for p in record.get("latency_curve") or []
        if p.get("p99_ms") is not None and p["p99_ms"] <= slo_ms and not p.get("errors") and p.get("achieved_rps")
    ]  # fmt: skip
    if not passing:
        raise SizingError(f"{record['name']}: no measured step met p99 <= {slo_ms:g} ms without errors")
    best = max(passing, key=lambda p: p["achieved_rps"])
    by_role = ((best.get("cpu") or {}).get("by_role")) or {}
    if not by_role:
        raise SizingError(f"{record['name']}: the step at {best['offered_rps']:g} RPS has no per-role CPU")
    per_tier: dict[str, float] = {}
    for role, cores in by_role.items():
        tier = tier_of(role, in_process)
        per_tier[tier] = per_tier.get(tier, 0.0) + 1000.0 * cores / best["achieved_rps"]
    return Capacity(
        setup=record["name"],
        server_cpus=len(record.get("server_cpus") or []),
        rps=best["achieved_rps"],
        p99_ms=best["p99_ms"],
        cpu_ms_per_request=per_tier,
    )


def size_tier(tier: str, cpu_ms: float, rps: float, max_utilization: float, cpus_per_pod: float) -> TierSize:
    """Cores and pods (at least 2) for `rps` at `cpu_ms` CPU ms per request."""
    cores = rps * cpu_ms / 1000.0 / max_utilization
    return TierSize(tier, cpu_ms, cores, max(2, math.ceil(cores / cpus_per_pod)), cpus_per_pod)


def pick(results: dict[str, Any], workload: str, column: str) -> dict[str, Any]:
    """The setup record shown in `column` for `workload` (for "split": the headline variant)."""
    records = [
        s for s in results.get("setups", [])
        if s.get("workload") == workload and s.get("column") == column and s.get("status") == "ok"
    ]  # fmt: skip
    if column == "split":
        records = [s for s in records if s.get("headline")] or records
    if not records:
        raise SizingError(f"no measured {column!r} setup for workload {workload!r} in the results")
    return records[0]


def sizing_report(
    results: dict[str, Any],
    *,
    rps: float,
    slo_ms: float,
    workload: str = "fraud",
    max_utilization: float = 0.6,
    api_pod_cpus: float = 2.0,
    serving_pod_cpus: float = 1.0,
    in_process_pod_cpus: float = 2.0,
    why: str = "",
) -> str:
    """The sizing as text: split tiers next to the in-process service (see the module doc)."""
    meta = results.get("meta", {})
    lines = [
        f"Target: {rps:,.0f} requests/s at peak{why}, p99 <= {slo_ms:g} ms, pods at <= "
        f"{max_utilization:.0%} CPU.",
        f"Measured inputs: {meta.get('started', 'a run')} (commit {meta.get('commit', '?')}), "
        f"workload {workload!r}: each setup's highest open-loop step with p99 <= {slo_ms:g} ms and no "
        f"errors, and the CPU per role during that step.",
        "",
    ]
    split = capacity(pick(results, workload, "split"), slo_ms)
    lines.append(
        f"split ({split.setup}): {split.rps:,.0f} RPS within the SLO on {split.server_cpus} CPU(s) "
        f"(p99 {split.p99_ms:.1f} ms); CPU per request: "
        + ", ".join(f"{t} {ms:.3f} ms" for t, ms in sorted(split.cpu_ms_per_request.items()))
    )
    total_cores = 0.0
    total_cpus = 0.0
    for tier, per_pod in (("api", api_pod_cpus), ("serving", serving_pod_cpus)):
        if tier not in split.cpu_ms_per_request:
            raise SizingError(f"{split.setup}: no CPU measured for the {tier} tier")
        size = size_tier(tier, split.cpu_ms_per_request[tier], rps, max_utilization, per_pod)
        total_cores += size.cores
        total_cpus += size.pods * per_pod
        lines.append(
            f"  {tier:8s} {size.cores:7.1f} cores -> {size.pods:3d} pods x {per_pod:g} CPU"
        )
    lines.append(f"  total    {total_cores:7.1f} cores busy at the target, {total_cpus:g} CPUs requested")
    try:
        tuned = capacity(pick(results, workload, "tuned"), slo_ms)
    except SizingError as exc:
        lines.append(f"in-process: not sized ({exc})")
    else:
        app_ms = sum(tuned.cpu_ms_per_request.values())
        size = size_tier("app", app_ms, rps, max_utilization, in_process_pod_cpus)
        lines.append(
            f"in-process ({tuned.setup}): {tuned.rps:,.0f} RPS within the SLO on {tuned.server_cpus} CPU(s) "
            f"(p99 {tuned.p99_ms:.1f} ms); CPU per request {app_ms:.3f} ms"
        )
        lines.append(
            f"  app      {size.cores:7.1f} cores -> {size.pods:3d} pods x {in_process_pod_cpus:g} CPU"
            f" ({size.pods * in_process_pod_cpus:g} CPUs requested)"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="a results.json written by `make bench`")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--rps", type=float, help="target peak requests per second")
    target.add_argument("--requests-per-day", type=float, help="average daily volume (with --peak-factor)")
    parser.add_argument("--peak-factor", type=float, default=10.0, help="peak / average rate (default 10)")
    parser.add_argument("--slo-ms", type=float, required=True, help="p99 latency bound, ms")
    parser.add_argument("--workload", default="fraud")
    parser.add_argument("--max-utilization", type=float, default=0.6)
    parser.add_argument("--api-pod-cpus", type=float, default=2.0)
    parser.add_argument("--serving-pod-cpus", type=float, default=1.0)
    parser.add_argument("--in-process-pod-cpus", type=float, default=2.0)
    args = parser.parse_args(argv)
    if not 0 < args.max_utilization <= 1:
        parser.error("--max-utilization must be in (0, 1]")
    why = ""
    rps = args.rps
    if rps is None:
        rps = args.requests_per_day / SECONDS_PER_DAY * args.peak_factor
        why = f" ({args.requests_per_day:,.0f} requests/day x {args.peak_factor:g} peak / 86,400 s)"
    results = json.loads(args.results.read_text())
    try:
        print(sizing_report(
            results, rps=rps, slo_ms=args.slo_ms, workload=args.workload,
            max_utilization=args.max_utilization, api_pod_cpus=args.api_pod_cpus,
            serving_pod_cpus=args.serving_pod_cpus, in_process_pod_cpus=args.in_process_pod_cpus, why=why,
        ))  # fmt: skip
    except SizingError as exc:
        print(f"sizing: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
