"""Goodput against offered load, from half to four times each setup's measured capacity.

    python -m bench.overload                         # make bench-overload; ~6 min on 2 cores
    python -m bench.overload --setups split --smoke  # the table's shape in under a minute

What overload does to a server that is already full: a server with admission keeps answering
about its capacity within the budget and refuses the rest at once (503), one without it
queues, its latency grows past every client's budget and its goodput falls towards nothing
(congestion collapse). For each setup (`bench.setups`: `split`, the product's default, beside
`tuned` and `naive`, the in-process servers) started as the benchmark starts it (servers
pinned to all CPUs but the last, the load generator `bench.loadgen` on the last), this measures
the capacity in a closed loop (`--connections` back to back after a warm-up), then offers
Poisson arrivals at each of `--factors` times that capacity for `--seconds` each, and prints one
row per step: offered, goodput (answers 200 within `--budget-ms` of their arrival, per second
and as a share of capacity), 503s, other failures (and by kind: late 200s, other statuses,
timeouts, reads cut, connects failed), the 200s' and the 503s' p50/p99 (a shed request should
learn it within milliseconds) and the generator's own send lag. The budget defaults to
the API's own (`REQUEST_TIMEOUT_S`, 2 s), so the split's 504s are counted as failures.

A busy machine makes the figures noise: run it on an otherwise idle one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.__main__ import default_pinning
from bench.load import LoadSettings, OpenLoopResult, run_closed_loop, run_open_loop
from bench.setups import all_setups, start
from bench.workload import FRAUD, body_pool, write_body_pool

FACTORS = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0)
SMOKE_FACTORS = (0.5, 2.0)
BUDGET_MS = 2000.0  # the API's REQUEST_TIMEOUT_S default
CONNECTIONS = 16  # the closed loop that measures capacity


@dataclass
class Step:
    """One offered load against one setup (rates per second)."""

    setup: str
    factor: float
    offered_rps: float
    planned: int  # arrivals offered
    within_budget: int  # 200s within the budget
    goodput_rps: float
    goodput_share: float  # of the measured capacity
    refused_503: int
    other_failures: int  # other statuses, late 200s, connect/read errors, timeouts
    p50_ms: float | None
    p99_ms: float | None
    # The failures by kind: late 200s, other statuses (504...), and the requests with no
    # answer: timeouts (none within the generator's timeout), read (connection closed or
    # reset with the request in flight), connect.
    late: int = 0
    other_statuses: int = 0
    timeouts: int = 0
    read_errors: int = 0
    connect_errors: int = 0
    refused_p50_ms: float | None = None  # the 503s': how fast a shed request was told
    refused_p99_ms: float | None = None
    generator_lag_p99_ms: float = 0.0  # how late the generator itself sent (bench.loadgen)


def measure(setup_name: str, factors: Sequence[float], seconds: float, budget_ms: float, tmp: Path) -> list[Step]:
    """Start `setup_name`, measure its capacity, offer each factor of it; the steps."""
    setup = {s.name: s for s in all_setups()}[setup_name]
    server_cpus, load_cpus = default_pinning(sorted(os.sched_getaffinity(0)))
    pool = write_body_pool(tmp / f"{setup_name}-bodies.jsonl")
    run_dir = tmp / setup_name
    run_dir.mkdir()
    steps: list[Step] = []
    with start(setup, FRAUD, cpus=server_cpus, run_dir=run_dir, probe=body_pool(1)[0]) as running:
        load = LoadSettings(url=running.url, pool=pool, cpus=load_cpus, timeout_s=budget_ms / 1000 + 3.0)
        run_closed_loop(load, connections=CONNECTIONS, duration_s=min(seconds, 3.0))  # warm-up
        capacity = run_closed_loop(load, connections=CONNECTIONS, duration_s=seconds).achieved_rps
        print(f"bench.overload: {setup_name}: capacity {capacity:.0f}/s", file=sys.stderr, flush=True)
        for seed, factor in enumerate(factors, start=1):
            run = run_open_loop(load, rate_rps=factor * capacity, duration_s=seconds, seed=seed, slo_ms=budget_ms)
            steps.append(step(setup_name, factor, capacity, run))
    return steps


def step(setup: str, factor: float, capacity: float, run: OpenLoopResult) -> Step:
    """A `Step` from one open-loop run: goodput is its 200s within the budget (`slo_ms`)."""
    within = run.ok - run.late
    refused = run.statuses.get("503", 0)
    goodput = within / run.duration_s
    return Step(
        setup=setup,
        factor=factor,
        offered_rps=run.offered_rps,
        planned=run.planned,
        within_budget=within,
        goodput_rps=goodput,
        goodput_share=goodput / capacity if capacity > 0 else 0.0,
        refused_503=refused,
        other_failures=run.errors.total - refused + run.late + run.unanswered,
        p50_ms=run.latency.p50_ms if run.latency else None,
        p99_ms=run.latency.p99_ms if run.latency else None,
        late=run.late,
        other_statuses=run.errors.status - refused,
        timeouts=run.errors.timeout,
        read_errors=run.errors.read,
        connect_errors=run.errors.connect,
        refused_p50_ms=run.refused_latency.p50_ms if run.refused_latency else None,
        refused_p99_ms=run.refused_latency.p99_ms if run.refused_latency else None,
        generator_lag_p99_ms=run.generator_lag_p99_ms,
    )


HEADER = ("setup", "x capacity", "offered/s", "goodput/s", "goodput % of capacity", "503", "other failed",
          "late / other status / timeout / read / connect", "p50 ms", "p99 ms", "503 p50 ms", "503 p99 ms",
          "generator lag p99 ms")  # fmt: skip


def table(steps: Sequence[Step]) -> str:
    """The steps as a Markdown table, one row per setup and factor."""

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f}"

    rows = [HEADER] + [
        (s.setup, f"{s.factor:g}", f"{s.offered_rps:.0f}", f"{s.goodput_rps:.0f}", f"{s.goodput_share:.0%}",
         str(s.refused_503), str(s.other_failures),
         f"{s.late} / {s.other_statuses} / {s.timeouts} / {s.read_errors} / {s.connect_errors}",
         ms(s.p50_ms), ms(s.p99_ms), ms(s.refused_p50_ms), ms(s.refused_p99_ms), f"{s.generator_lag_p99_ms:.1f}")
        for s in steps
    ]  # fmt: skip
    lines = ["| " + " | ".join(r) + " |" for r in rows]
    lines.insert(1, "|" + "|".join("---" for _ in HEADER) + "|")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.overload", description=__doc__.splitlines()[0])
    parser.add_argument("--setups", default="split,tuned,naive", help="comma-separated bench.setups names")
    parser.add_argument("--seconds", type=float, default=12.0, help="each step's (and the capacity's) length")
    parser.add_argument("--factors", default=",".join(f"{f:g}" for f in FACTORS), help="offered x capacity")
    parser.add_argument("--budget-ms", type=float, default=BUDGET_MS, help="a 200 later than this is not goodput")
    parser.add_argument("--smoke", action="store_true", help="2 short steps (0.5x, 2x): the table's shape only")
    parser.add_argument("--json", type=Path, help="also write the steps here")
    args = parser.parse_args(argv)
    factors = SMOKE_FACTORS if args.smoke else tuple(float(f) for f in args.factors.split(","))
    seconds = 2.0 if args.smoke else args.seconds
    steps: list[Step] = []
    with tempfile.TemporaryDirectory(prefix="bench-overload-") as tmp:
        for name in args.setups.split(","):
            steps += measure(name, factors, seconds, args.budget_ms, Path(tmp))
    print(table(steps))
    if args.json:
        args.json.write_text(json.dumps([asdict(s) for s in steps], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
