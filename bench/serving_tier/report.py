"""The serving-tier benchmark's table and goals (the serving issue's targets)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from bench.serving_tier.result import Run

GOAL_GRPC_RPS_ONE_CORE = 3000
GOAL_PREDICTIONS_PER_S = 100_000
BUSY_MACHINE_CORES = 0.25


def _ms(value: float | None, width: int = 8) -> str:
    """A latency cell: two decimals, ``-`` when the generator does not report it."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return f"{'-':>{width}}"
    return f"{value:>{width}.2f}"


def table(runs: Sequence[Run]) -> str:
    header = (
        f"{'protocol':<13}{'cores':>6}{'batching':>9}{'rows':>6}{'conn x str':>11}  "
        f"{'generator':<10}{'answers/s':>10}{'pred/s':>11}{'p50 ms':>8}{'p99 ms':>8}"
        f"{'mean ms':>8}{'max ms':>8}{'batch':>7}{'srv CPU':>8}{'gen CPU':>8}{'other':>7}  errors"
    )
    lines = [header, "-" * len(header)]
    for run in runs:
        batch = f"{run.mean_batch_size:.1f}" if run.mean_batch_size else "-"
        errors = {**run.errors, **{f"server {k}": v for k, v in run.server_errors.items()}}
        error_text = ", ".join(f"{k}={v}" for k, v in errors.items()) or "0"
        busy = "*" if run.other_cpu_cores > BUSY_MACHINE_CORES else " "
        shape = f"{run.connections}x{run.streams}"
        lines.append(
            f"{run.protocol:<13}{run.server_cpus:>6}{run.batching:>9}"
            f"{run.rows_per_request:>6}{shape:>11}  {(run.generator or '-').split()[0]:<10}"
            f"{run.rps:>10,.0f}{run.predictions_per_s:>11,.0f}{_ms(run.p50_ms)}{_ms(run.p99_ms)}"
            f"{_ms(run.latency_mean_ms)}{_ms(run.latency_max_ms)}{batch:>7}"
            f"{run.server_cpu_cores:>8.2f}{run.load_cpu_cores:>8.2f}{run.other_cpu_cores:>6.2f}"
            f"{busy}  {error_text}"
            + ("  FLAGGED" if run.flags else "")
            + (f"  ({run.note})" if run.note else "")
        )
    if any(run.other_cpu_cores > BUSY_MACHINE_CORES for run in runs):
        lines.append(
            f"* the rest of the machine used more than {BUSY_MACHINE_CORES} cores during the "
            "run: its figures are lower than on a quiet machine"
        )
    if any(run.generator == "h2load" for run in runs):
        lines.append(
            "h2load reports no latency percentiles (p50/p99 '-'); its mean and max are of every "
            "call in the measured interval"
        )
    for run in runs:
        for flag in run.flags:
            lines.append(
                f"FLAGGED {run.protocol}, {run.server_cpus} core(s), batching {run.batching}, "
                f"{run.rows_per_request} rows: {flag}"
            )
    return "\n".join(lines)


def goals(runs: Sequence[Run]) -> list[dict[str, Any]]:
    def best(candidates: list[Run], key: str) -> Run | None:
        return max(candidates, key=lambda r: float(getattr(r, key)), default=None)

    trusted = [r for r in runs if not r.flags]
    grpc_one_core = best(
        [
            r
            for r in trusted
            if r.protocol == "gRPC"
            and r.server_cpus == 1
            and r.batching != "off"
            and r.rows_per_request == 1
        ],
        "rps",
    )
    big = best(
        [r for r in trusted if r.rows_per_request == 256 and r.protocol in ("gRPC", "REST")],
        "predictions_per_s",
    )

    def where(run: Run | None) -> str:
        if run is None:
            return "not measured"
        return f"{run.protocol}, {run.server_cpus} core(s), batching {run.batching}"

    return [
        {
            "goal": f">= {GOAL_GRPC_RPS_ONE_CORE:,} answers/s on 1 core, gRPC, batching on",
            "measured": round(grpc_one_core.rps) if grpc_one_core else 0,
            "where": where(grpc_one_core),
            "held": bool(grpc_one_core and grpc_one_core.rps >= GOAL_GRPC_RPS_ONE_CORE),
        },
        {
            "goal": f">= {GOAL_PREDICTIONS_PER_S:,} predictions/s with 256-row requests",
            "measured": round(big.predictions_per_s) if big else 0,
            "where": where(big),
            "held": bool(big and big.predictions_per_s >= GOAL_PREDICTIONS_PER_S),
        },
    ]
