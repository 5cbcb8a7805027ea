"""`python -m bench`: the before/after benchmark, side by side, in one command.

    python -m bench                 # quick plan, under 5 minutes on 2 cores (make bench)
    python -m bench --full          # full plan (make bench-full)
    python -m bench --setups naive,tuned,split-rest
    python -m bench --profile       # also profile the best split variant with py-spy

Starts every setup itself on 127.0.0.1 (see bench.setups), drives it with wrk, prints
progress as it goes, and writes report.md, results.json and PNG plots to
bench/results/<UTC timestamp>/ (bench/results/latest points at the newest run).
Exit status: 0 when the run completed (whether or not the goals held), 2 on a bad
command line or a missing tool.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

from bench.goals import evaluate
from bench.load import LoadToolError, require_wrk
from bench.plan import FULL, QUICK
from bench.processes import REPO
from bench.report import goals_table, headline_table, write_outputs
from bench.runner import Environment, Runner
from bench.setups import all_setups
from bench.workload import body_pool, write_body_pool

DEFAULT_OUT = REPO / "bench" / "results"


def _cpu_list(text: str) -> tuple[int, ...]:
    """"0", "0,1", "0-2" → CPU numbers."""
    cpus: list[int] = []
    for part in filter(None, text.split(",")):
        low, _, high = part.partition("-")
        cpus.extend(range(int(low), int(high or low) + 1))
    return tuple(cpus)


def default_pinning(cpus: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Servers on all CPUs but the last, wrk on the last; nothing pinned on one CPU."""
    cpus = sorted(cpus)
    if len(cpus) < 2:
        return (), ()
    return tuple(cpus[:-1]), (cpus[-1],)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument(
        "--full", action="store_true", help="the full plan (longer runs, more loads)"
    )
    parser.add_argument(
        "--setups", default="", help="comma-separated setup names (default: all); see --list"
    )
    parser.add_argument("--list", action="store_true", help="list the setups and exit")
    parser.add_argument("--server-cpus", type=_cpu_list, help="CPUs for the servers, e.g. 0 or 0-2")
    parser.add_argument("--load-cpus", type=_cpu_list, help="CPUs for wrk, e.g. 3")
    parser.add_argument("--no-pin", action="store_true", help="pin nothing (all share all CPUs)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results root folder")
    parser.add_argument(
        "--profile", action="store_true", help="profile the best split variant with py-spy"
    )
    return parser


def _meta(mode: str, server: tuple[int, ...], load: tuple[int, ...]) -> dict[str, object]:
    def first_line(*args: str) -> str:
        # `wrk -v` prints its version and then exits 1 (usage): take the line anyway.
        try:
            done = subprocess.run(args, capture_output=True, text=True, timeout=10, cwd=REPO)
        except (OSError, subprocess.TimeoutExpired):
            return "?"
        lines = (done.stdout or done.stderr).strip().splitlines()
        return lines[0] if lines else "?"

    cpu_model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    return {
        "mode": mode,
        "started_at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "cpus": len(os.sched_getaffinity(0)),
        "cpu_model": cpu_model,
        "loadavg": " ".join(Path("/proc/loadavg").read_text().split()[:3]),
        "python": platform.python_version(),
        "wrk": first_line("wrk", "-v").split(" Copyright")[0],
        "commit": first_line("git", "rev-parse", "--short", "HEAD"),
        "pinning": {"server_cpus": list(server), "load_cpus": list(load)},
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; returns the exit status."""
    args = _parser().parse_args(argv)
    setups = all_setups()
    if args.list:
        for s in setups:
            state = "" if s.available else f"  [{s.unavailable_reason}]"
            print(f"{s.name:28} {s.description}{state}")
        return 0
    if args.setups:
        wanted = [name.strip() for name in args.setups.split(",") if name.strip()]
        unknown = set(wanted) - {s.name for s in setups}
        if unknown:
            print(f"python -m bench: unknown setups {sorted(unknown)}; see --list", file=sys.stderr)
            return 2
        setups = [s for s in setups if s.name in wanted]
    try:
        require_wrk()
    except LoadToolError as exc:
        print(f"python -m bench: {exc}", file=sys.stderr)
        return 2

    if args.no_pin:
        server_cpus, load_cpus = (), ()
    else:
        server_cpus, load_cpus = default_pinning(sorted(os.sched_getaffinity(0)))
        server_cpus = args.server_cpus or server_cpus
        load_cpus = args.load_cpus or load_cpus
    plan = FULL if args.full else QUICK
    run_dir = args.out / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    run_dir.mkdir(parents=True, exist_ok=True)
    pool = write_body_pool(run_dir / "bodies.jsonl")
    env = Environment(
        run_dir=run_dir,
        pool=pool,
        probe=body_pool(1)[0],
        server_cpus=server_cpus,
        load_cpus=load_cpus,
    )

    def progress(line: str) -> None:
        print(line, flush=True)

    meta = _meta(plan.mode, server_cpus, load_cpus)
    progress(
        f"[bench] {plan.mode} plan, {len(setups)} setups, servers on CPUs "
        f"{','.join(map(str, server_cpus)) or 'all'}, wrk on CPUs "
        f"{','.join(map(str, load_cpus)) or 'all'}; load average {meta['loadavg']}; "
        f"output {run_dir}"
    )
    started = time.monotonic()
    runner = Runner(plan, env, progress)
    results = runner.run(setups)
    if args.profile:
        from bench.profile import profile_best_split

        meta["profile"] = profile_best_split(runner, results, setups)
    meta["duration_s"] = round(time.monotonic() - started, 1)
    meta["plan"] = asdict(plan)
    results.meta = meta
    results.goals = evaluate(results)
    outputs = write_outputs(results, run_dir)

    print()
    print(headline_table(results))
    print()
    print(goals_table(results))
    print()
    for path in outputs.values():
        print(f"[bench] wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
    print(f"[bench] done in {meta['duration_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
