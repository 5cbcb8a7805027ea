"""`python -m bench --hop`: what the split's hop to serving and back costs at low load, and why.

The target (`bench.goals`, "median at low load") compares the split's p50 with tuned's at 10 %
of tuned's SLO-RPS, where nothing queues: the difference is the hop's fixed cost. This
profile runs that rate (`--hop-rate`, else 10 % of tuned's SLO-RPS in `bench/results/latest`,
else 10 % of tuned's closed-loop RPS) open loop against tuned, the headline split (Unix-domain
sockets between the tiers), the split over loopback TCP (`SERVING_UNIX_SOCKETS=0`, the
transport before), over gRPC, and with every Session run handed to a thread
(`--session_run_inline_below_us=0`; run-server.sh runs short ones on serving's event loop),
and records for each:

- p50 / p99 from the intended send time, and the p50's difference from tuned's;
- CPU per request by role (API worker, serving, ...), ms, from /proc/PID/stat;
- wake-ups per request by role: context switches (voluntary + involuntary, every thread, from
  /proc/PID/task/TID/status) over the run divided by the requests answered. A request the
  API hands to serving's event loop, which hands it to a Session thread, which hands it back,
  wakes threads that a one-process server never wakes; on a CPU whose context switches cost
  more, that is the difference;
- for the API's setups, the median of each `Server-Timing` stage the API reports (validate,
  features, serving -- the round trip to serving -- and total, ms) over `TIMING_REQUESTS`
  requests sent one at a time after the run: how much of the API's time is the hop;
- a py-spy profile of the headline split during its run (busy threads only, as
  `bench.profile`: by package and by function, per process).

It writes `hop.md` and `hop.json` to the run folder, and names the CPU model and its flags
(`/proc/cpuinfo`), so that the two kinds of CPU can be put side by side.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.load import run_open_loop
from bench.processes import taskset
from bench.procfs import CLK_TCK, PROC, tree_cpu_ticks
from bench.profile import SAMPLE_RATE_HZ, parse_collapsed, pyspy_path, summarize
from bench.setups import TUNED, Setup, all_setups, custom_variant

if TYPE_CHECKING:
    from bench.runner import Runner
    from bench.workload import Workload

HOP_S = 6.0  # seconds of arrivals per setup
TIMING_REQUESTS = 200  # one at a time, for the Server-Timing medians
LOW_LOAD_SHARE = 0.1


def context_switches(pid: int, proc: Path = PROC) -> int:
    """Voluntary + involuntary context switches of every thread of `pid` so far (0 if gone)."""
    total = 0
    try:
        tasks = list((proc / str(pid) / "task").iterdir())
    except OSError:
        return 0
    for task in tasks:
        try:
            text = (task / "status").read_text()
        except OSError:
            continue
        total += parse_switches(text)
    return total


def parse_switches(status: str) -> int:
    """voluntary_ctxt_switches + nonvoluntary_ctxt_switches of one /proc/.../status text."""
    total = 0
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
            total += int(value.strip() or 0)
    return total


def per_role(values: dict[int, float], roles: dict[int, str]) -> dict[str, float]:
    """Sum pid -> value into role -> value (unknown pids under "other")."""
    out: dict[str, float] = {}
    for pid, value in values.items():
        role = roles.get(pid, "other")
        out[role] = out.get(role, 0.0) + value
    return out


def _diff(after: dict[int, int], before: dict[int, int], pids: Iterable[int]) -> dict[int, float]:
    return {pid: float(after.get(pid, 0) - before.get(pid, 0)) for pid in pids}


#: The serving lever of fewer wake-ups (short Session runs on serving's event loop, the
#: one-container default) switched off: every run handed to a thread and back.
NO_INLINE_ARGS = "--session_run_inline_below_us=0"


def parse_server_timing(header: str) -> dict[str, float]:
    """`validate;dur=0.74, serving;dur=3.24` -> {"validate": 0.74, "serving": 3.24} (ms)."""
    out: dict[str, float] = {}
    for part in header.split(","):
        name, _, params = part.strip().partition(";")
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key == "dur" and name:
                try:
                    out[name] = float(value)
                except ValueError:
                    pass
    return out


def server_timing_medians(url: str, body: bytes, count: int) -> dict[str, float]:
    """Median ms of each Server-Timing stage over `count` sequential requests ({} if none)."""
    import statistics

    import httpx

    stages: dict[str, list[float]] = {}
    with httpx.Client(timeout=5.0) as client:
        for _ in range(count):
            answer = client.post(url, content=body, headers={"content-type": "application/json"})
            for name, ms in parse_server_timing(answer.headers.get("server-timing", "")).items():
                stages.setdefault(name, []).append(ms)
    return {name: round(statistics.median(values), 3) for name, values in stages.items()}


def hop_setups() -> list[Setup]:
    """tuned, the headline split, the split over loopback TCP (the transport before the
    sockets), over gRPC (its socket), and without serving's inline Session runs."""
    headline = next(s for s in all_setups() if s.headline)
    tcp = custom_variant({"SERVING_UNIX_SOCKETS": "0"})
    grpc = custom_variant({"SERVING_PROTOCOL": "grpc"})
    inline = custom_variant({"SERVING_ARGS": NO_INLINE_ARGS})
    return [TUNED, headline, tcp, grpc, inline]


def latest_tuned_rate(results_root: Path, workload: str) -> float | None:
    """10 % of tuned's SLO-RPS for `workload` in `results_root/latest/results.json`, if any."""
    path = results_root / "latest" / "results.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    for record in data.get("setups", []):
        if record.get("workload") == workload and record.get("column") == "tuned" and record.get("slo_rps"):
            return LOW_LOAD_SHARE * float(record["slo_rps"])
    return None


def _pyspy(runner: Runner, pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes] | None:
    try:
        binary = pyspy_path()
    except FileNotFoundError:
        return None
    return subprocess.Popen(
        [*taskset(runner.env.load_cpus), binary, "record", f"--pid={pid}", "--subprocesses",
         f"--duration={int(seconds)}", f"--rate={SAMPLE_RATE_HZ}", "--format=raw", f"--output={out}",
         "--nonblocking"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )


def measure_setup(runner: Runner, setup: Setup, workload: Workload, rate: float, *,
                  profile: bool) -> dict[str, Any]:
    """One setup at `rate` for HOP_S seconds: latency, CPU and wake-ups per request by role."""
    out: dict[str, Any] = {"setup": setup.name}
    with runner.start_setup(setup, workload) as running:
        load = runner.load_settings(running)
        runner.warm_up(running, load)
        runner.wait_idle(running)
        pids = running.pids()
        roles = running.roles()
        cpu_before = tree_cpu_ticks(pids)
        cs_before = {pid: context_switches(pid) for pid in pids}
        recorder = None
        raw = runner.env.run_dir / f"hop-profile-{workload.name}-{setup.name}.txt"
        if profile:
            recorder = _pyspy(runner, running.root.pid, HOP_S, raw)
        started = time.monotonic()
        run = run_open_loop(load, rate_rps=rate, duration_s=HOP_S, seed=runner.plan.seed,
                            slo_ms=runner.slo_for(workload))
        wall = time.monotonic() - started
        cpu_after = tree_cpu_ticks(pids)
        cs_after = {pid: context_switches(pid) for pid in pids}
        answered = max(1, run.ok)
        cpu_ms = per_role({p: v * 1000.0 / CLK_TCK for p, v in _diff(cpu_after, cpu_before, pids).items()}, roles)
        switches = per_role(_diff(cs_after, cs_before, pids), roles)
        lat = run.latency
        out.update({
            "rate_rps": rate, "answered": run.ok, "errors": run.errors.total, "wall_s": round(wall, 2),
            "p50_ms": lat.p50_ms if lat else None, "p99_ms": lat.p99_ms if lat else None,
            "cpu_ms_per_request": {k: round(v / answered, 4) for k, v in sorted(cpu_ms.items())},
            "wakeups_per_request": {k: round(v / answered, 2) for k, v in sorted(switches.items())},
        })
        if setup.kind == "split":
            out["server_timing_ms"] = server_timing_medians(running.url, runner.env.probe, TIMING_REQUESTS)
        if recorder is not None:
            try:
                recorder.communicate(timeout=HOP_S + 30)
            except subprocess.TimeoutExpired:
                recorder.kill()
                recorder.communicate()
            if raw.exists():
                out["profile"] = {"raw": raw.name, **summarize(parse_collapsed(raw.read_text()))}
    runner.say(f"{workload.name}/{setup.name} at {rate:,.0f} RPS: p50 {out['p50_ms'] or 0:.2f} ms, CPU ms/request "
               f"{out['cpu_ms_per_request']}, wake-ups/request {out['wakeups_per_request']}")
    return out


def run_hop(runner: Runner, workload: Workload, rate: float | None, results_root: Path,
            meta: dict[str, Any]) -> dict[str, Any]:
    """The whole hop profile (see the module docstring); writes hop.md and hop.json."""
    setups = hop_setups()
    if rate is None:
        rate = latest_tuned_rate(results_root, workload.name)
    rows: list[dict[str, Any]] = []
    for setup in setups:
        if rate is None:  # 10 % of tuned's closed-loop RPS, measured now
            with runner.start_setup(setup, workload) as running:
                closed, _ = runner.warm_up(running, runner.load_settings(running))
            rate = max(5.0, round(LOW_LOAD_SHARE * closed, 1))
        rows.append(measure_setup(runner, setup, workload, rate, profile=setup.headline))
    tuned_p50 = rows[0].get("p50_ms")
    for row in rows:
        if tuned_p50 is not None and row.get("p50_ms") is not None:
            row["p50_over_tuned_ms"] = round(row["p50_ms"] - tuned_p50, 3)
    document = {"meta": meta, "workload": workload.name, "rate_rps": rate, "setups": rows}
    run_dir = runner.env.run_dir
    (run_dir / "hop.json").write_text(json.dumps(document, indent=2) + "\n")
    (run_dir / "hop.md").write_text(hop_markdown(document))
    return document


def hop_markdown(document: dict[str, Any]) -> str:
    """hop.md: the machine, then one row per setup, then the headline split's profile."""
    meta = document.get("meta", {})
    lines = [
        f"# The hop at low load: {document.get('workload')} at {document.get('rate_rps') or 0:,.0f} RPS",
        "",
        f"{meta.get('cpu_model', '?')}; AVX-512 {'yes' if meta.get('avx512') else 'no'}; flags "
        f"{' '.join(meta.get('cpu_flags', [])) or '?'}; {meta.get('cpus', '?')} CPUs, servers on "
        f"{meta.get('pinning', {}).get('server_cpus')}; load average {meta.get('loadavg', '?')}; "
        f"commit {meta.get('commit', '?')}; {meta.get('started_at', '?')}.",
        "",
        "| setup | p50 (ms) | p99 (ms) | p50 - tuned's (ms) | CPU ms per request, by role | "
        "wake-ups per request, by role | API Server-Timing medians (ms) | answered |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in document.get("setups", []):
        def fmt(d: dict[str, float]) -> str:
            return ", ".join(f"{k} {v:g}" for k, v in d.items()) or "–"
        lines.append(
            f"| {row['setup']} | {row.get('p50_ms') or 0:.2f} | {row.get('p99_ms') or 0:.2f} | "
            f"{row.get('p50_over_tuned_ms', 0):+.2f} | {fmt(row.get('cpu_ms_per_request', {}))} | "
            f"{fmt(row.get('wakeups_per_request', {}))} | {fmt(row.get('server_timing_ms', {}))} "
            f"| {row.get('answered')} |"
        )
    for row in document.get("setups", []):
        profile = row.get("profile")
        if not profile:
            continue
        lines += ["", f"## py-spy, {row['setup']} ({profile['samples']:,} samples, busy threads only)", ""]
        for key, title in (("leaf_packages", "Leaf frame's package"), ("self", "Self time"),
                           ("project_total", "Under the project's own functions")):
            lines += [f"| {title} | share |", "|---|---|"]
            lines += [f"| `{k}` | {v:.1%} |" for k, v in profile[key]]
            lines.append("")
    return "\n".join(lines) + "\n"
