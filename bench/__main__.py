"""`python -m bench`: throughput at a latency SLO, every setup side by side, in one command.

    python -m bench                         # quick plan, at most 12 minutes on 2 cores (make bench)
    python -m bench --full                  # full plan: every variant, longer steps (make bench-full)
    python -m bench --smoke                 # every path in a few seconds per step; figures mean nothing
    python -m bench --workload fraud --setups tuned,split,split-no-coalescing
    python -m bench --slo-ms 50             # one fixed bound for every workload (default: derived)
    python -m bench --workload fraud --setups tuned,split --variant SERVING_ARGS=--enable_batching
    python -m bench --profile               # also profile the headline split with py-spy
    python -m bench --hop                   # the hop at low load: tuned vs split (sockets, TCP, gRPC)

Starts every setup itself on 127.0.0.1 (see bench.setups), drives it with the open-loop
generator (bench.loadgen), searches each setup's SLO-RPS (bench.slo), prints progress as it
goes and the SLO table and targets at the end, and writes report.md, results.json and
slo_curves.png / memory.png to bench/results/<UTC timestamp>/ (bench/results/latest points at
the newest run). Exit status: 0 when the run completed (whether or not the targets held), 2
on a bad command line.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from datetime import UTC, datetime
from pathlib import Path

from bench.goals import evaluate
from bench.peers import PEERS, PeerInstallError, ensure_installed
from bench.plan import FULL, QUICK, SMOKE, Plan
from bench.processes import REPO
from bench.report import goals_table, slo_lines, slo_table, write_outputs
from bench.runner import Environment, Job, Runner
from bench.setups import Setup, all_setups, custom_variant
from bench.workload import FRAUD, WORKLOADS, Workload, body_pool, write_body_pool

#: What each plan runs per workload by default (--setups overrides).
QUICK_SETUPS = {
    # The headline split, what it is compared with (tuned, the ceiling, naive's memory) and
    # the peers; the split's variants are in the full plan (or --setups, --variant).
    "fraud": ("tuned", "ceiling", "naive", "split", "bentoml", "ray-serve"),
    "fraud-transformer": ("tuned", "split", "bentoml", "ray-serve"),
}
#: The CPU flags the report names (the instruction sets TensorFlow's kernels pick from).
REPORTED_CPU_FLAGS = ("avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "avx2", "fma", "avx", "sse4_2")

DEFAULT_OUT = REPO / "bench" / "results"


def _cpu_list(text: str) -> tuple[int, ...]:
    """"0", "0,1", "0-2" → CPU numbers, each one this process may run on.

    Raises:
        argparse.ArgumentTypeError: not such a list, or a CPU outside this process's affinity
            (checked here, before the run: taskset would fail every setup's start minutes in,
            after the peers' install).
    """
    cpus: list[int] = []
    try:
        for part in filter(None, text.split(",")):
            low, _, high = part.partition("-")
            cpus.extend(range(int(low), int(high or low) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a CPU list (e.g. 0, 0,1 or 0-2): {text!r}") from None
    allowed = os.sched_getaffinity(0)
    if not cpus or not set(cpus) <= allowed:
        raise argparse.ArgumentTypeError(
            f"CPUs {text!r}: this machine lets the benchmark run on CPUs {sorted(allowed)}")
    return tuple(cpus)


def default_pinning(cpus: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Servers on all CPUs but the last, the load generator on the last; nothing pinned on one CPU."""
    cpus = sorted(cpus)
    if len(cpus) < 2:
        return (), ()
    return tuple(cpus[:-1]), (cpus[-1],)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument(
        "--full", action="store_true", help="the full plan (every variant, longer steps)"
    )
    parser.add_argument(
        "--smoke", action="store_true",
        help="a tiny plan that runs every path (setups, peer installs, the report) in seconds "
        "per step: for checking the benchmark itself, its figures mean nothing",
    )
    parser.add_argument(
        "--workload", default=",".join(WORKLOADS),
        help=f"comma-separated workloads ({', '.join(WORKLOADS)}); default: all",
    )
    parser.add_argument(
        "--setups", default="",
        help="comma-separated setup names for every workload (default: the plan's); see --list",
    )
    parser.add_argument(
        "--slo-ms", type=float,
        help="one p99 bound in ms for every workload (default: each workload's, derived from "
        "the tuned setup's unloaded p50: max(25, 10 x p50), rounded up to 5 ms)",
    )
    parser.add_argument(
        "--variant", action="append", default=[], metavar="NAME=VALUE[,NAME=VALUE]",
        help="also run the split with these run-server.sh settings (repeatable), e.g. "
        "--variant SERVING_ARGS=--enable_batching; named split+NAME=VALUE",
    )
    parser.add_argument("--list", action="store_true", help="list the setups and exit")
    parser.add_argument("--server-cpus", type=_cpu_list, help="CPUs for the servers, e.g. 0 or 0-2")
    parser.add_argument("--load-cpus", type=_cpu_list, help="CPUs for the load generator, e.g. 3")
    parser.add_argument("--no-pin", action="store_true", help="pin nothing (all share all CPUs)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results root folder")
    parser.add_argument(
        "--profile", action="store_true", help="profile the headline split with py-spy"
    )
    parser.add_argument(
        "--hop", action="store_true",
        help="only the hop profile (bench.hop): tuned and the split's transports at low load, "
        "CPU and wake-ups per request, py-spy of the split; hop.md in the run folder",
    )
    parser.add_argument(
        "--hop-rate", type=float,
        help="--hop's rate, requests/s (default: 10 %% of tuned's SLO-RPS in bench/results/latest)",
    )
    return parser


def _meta(mode: str, server: tuple[int, ...], load: tuple[int, ...]) -> dict[str, object]:
    def first_line(*args: str) -> str:
        try:
            done = subprocess.run(args, capture_output=True, text=True, timeout=10, cwd=REPO)
        except (OSError, subprocess.TimeoutExpired):
            return "?"
        lines = (done.stdout or done.stderr).strip().splitlines()
        return lines[0] if lines else "?"

    cpu_model, flags = cpu_info()
    return {
        "mode": mode,
        "started_at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "cpus": len(os.sched_getaffinity(0)),
        "cpu_model": cpu_model,
        "cpu_flags": [f for f in REPORTED_CPU_FLAGS if f in flags],
        "avx512": "avx512f" in flags,
        "cpu_flags_all": sorted(flags),
        "loadavg": " ".join(Path("/proc/loadavg").read_text().split()[:3]),
        "python": platform.python_version(),
        "commit": first_line("git", "rev-parse", "--short", "HEAD"),
        "pinning": {"server_cpus": list(server), "load_cpus": list(load)},
    }


def cpu_info(cpuinfo: str | None = None) -> tuple[str, set[str]]:
    """(model name, flags) of the first CPU in /proc/cpuinfo (or `cpuinfo`'s text); "?" and
    no flags when it cannot be read."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return "?", set()
    model, flags = "?", set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and model == "?":
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    return model, flags


def jobs_for(
    plan: Plan, workloads: Sequence[Workload], setups: Sequence[Setup], wanted: Sequence[str],
    also: Sequence[str] = (),
) -> list[Job]:
    """The (workload, setup) jobs of a run, in run order (tuned before the splits: their
    targets compare at tuned's SLO-RPS): `wanted`, else the plan's, and `also` (--variant).
    Memory is measured for the first workload only: the headline split, naive, tuned and
    the peers, what the memory targets compare (the full plan adds the ceiling and every
    split variant)."""
    jobs = []
    for i, workload in enumerate(workloads):
        if wanted:
            names = set(wanted)
        elif plan.mode == "full":
            names = {s.name for s in setups}
        else:
            names = set(QUICK_SETUPS.get(workload.name, QUICK_SETUPS[FRAUD.name]))
            if workload.name != FRAUD.name:
                names.discard("naive")  # its memory is the fraud workload's
        names |= set(also)
        for setup in setups:
            if setup.name in names:
                memory = i == 0 and (plan.memory_variants or setup.column in ("naive", "tuned", "peer")
                                     or (setup.column == "split" and setup.headline))
                jobs.append(Job(workload, setup, memory=memory))
    return jobs


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; returns the exit status."""
    args = _parser().parse_args(argv)
    setups = all_setups()
    if args.list:
        for s in setups:
            state = "" if s.available else f"  [{s.unavailable_reason}]"
            print(f"{s.name:24} {s.description}{state}")
        print("\nworkloads:")
        for w in WORKLOADS.values():
            print(f"{w.name:24} {w.description}")
        return 0
    wanted = [name.strip() for name in args.setups.split(",") if name.strip()]
    try:
        variants = [custom_variant(dict(item.split("=", 1) for item in spec.split(",")))
                    for spec in args.variant]
    except ValueError as exc:
        print(f"python -m bench: --variant: {exc} (NAME=VALUE[,NAME=VALUE])", file=sys.stderr)
        return 2
    setups += variants
    unknown = set(wanted) - {s.name for s in setups}
    if unknown:
        print(f"python -m bench: unknown setups {sorted(unknown)}; see --list", file=sys.stderr)
        return 2
    names = [w.strip() for w in args.workload.split(",") if w.strip()]
    if not names or set(names) - WORKLOADS.keys():
        print(f"python -m bench: --workload takes {', '.join(WORKLOADS)}", file=sys.stderr)
        return 2
    if args.slo_ms is not None and not args.slo_ms > 0:
        print("python -m bench: --slo-ms must be > 0", file=sys.stderr)
        return 2

    if args.no_pin:
        server_cpus, load_cpus = (), ()
    else:
        server_cpus, load_cpus = default_pinning(sorted(os.sched_getaffinity(0)))
        server_cpus = args.server_cpus or server_cpus
        load_cpus = args.load_cpus or load_cpus
    if args.full and args.smoke:
        print("python -m bench: --full and --smoke exclude each other", file=sys.stderr)
        return 2
    plan = FULL if args.full else SMOKE if args.smoke else QUICK
    if args.slo_ms is not None:
        plan = replace(plan, slo_ms=args.slo_ms)
    jobs = jobs_for(plan, [WORKLOADS[n] for n in names], setups, wanted,
                    also=[v.name for v in variants])
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
    meta["slo_ms"] = plan.slo_ms
    meta["command"] = " ".join(["python -m bench", *(argv if argv is not None else sys.argv[1:])])
    budget = f", time budget {plan.time_budget_s / 60:g} min" if plan.time_budget_s else ""
    slo = f"SLO p99 <= {plan.slo_ms:g} ms" if plan.slo_ms else "each workload's SLO derived from tuned"
    progress(
        f"[bench] {plan.mode} plan, {len(jobs)} setups ("
        + ", ".join(f"{j.workload.name}/{j.setup.name}" for j in jobs)
        + f"), {plan.searches} searches each, {slo}{budget}; servers on CPUs "
        f"{','.join(map(str, server_cpus)) or 'all'}, load generator on CPUs "
        f"{','.join(map(str, load_cpus)) or 'all'}; {meta['cpu_model']} "
        f"(AVX-512 {'yes' if meta['avx512'] else 'no'}; {' '.join(meta['cpu_flags'])}); "
        f"load average {meta['loadavg']}; output {run_dir}"
    )
    if plan.mode == "smoke":
        progress("[bench] smoke plan: checks that every path runs; its figures are not results")
    for peer in sorted({j.setup.peer for j in jobs if j.setup.kind == "peer"}):
        try:
            ensure_installed(PEERS[peer], progress)
        except PeerInstallError as exc:
            progress(f"[bench] peer {peer} cannot be installed: {exc}")  # its setup says so too
    started = time.monotonic()
    runner = Runner(plan, env, progress)
    if args.hop:
        from bench.hop import run_hop

        workload = WORKLOADS[names[0]]
        run_hop(runner, workload, args.hop_rate, args.out, meta)
        print((run_dir / "hop.md").read_text())
        print(f"[bench] wrote {run_dir / 'hop.md'} and hop.json in {time.monotonic() - started:.0f} s")
        return 0
    results = runner.run(jobs)
    if args.profile:
        from bench.profile import profile_headline_split

        meta["profile"] = profile_headline_split(runner, results, jobs[0].workload)
    meta["duration_s"] = round(time.monotonic() - started, 1)
    meta["plan"] = asdict(plan)
    meta.update(results.meta)  # the workloads' SLOs and model costs, from the runner
    results.meta = meta
    results.goals = evaluate(results)
    outputs = write_outputs(results, run_dir)

    print()
    print("SLO per workload:")
    print("\n".join(slo_lines(results)))
    print()
    print(slo_table(results))
    print()
    print(goals_table(results))
    print()
    for path in outputs.values():
        print(f"[bench] wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
    print(f"[bench] done in {meta['duration_s']:.0f} s")
    return 0


def _exit_on_signal(signum: int, _frame: object) -> None:
    """SIGTERM or SIGHUP as an exit that unwinds: every running setup is a context manager
    (`bench.setups.RunningSetup`), stopped on the way out. By the signals' default action the
    interpreter died at once and left the setup in flight running in its own sessions (a
    split's run-server.sh, serving and the API, measured: five processes left)."""
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    for _signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(_signum, _exit_on_signal)
    sys.exit(main())
