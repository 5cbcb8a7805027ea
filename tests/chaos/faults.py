"""The faults of the chaos run, the processes they hit, and what each must leave standing.

Four stacks, all on 127.0.0.1 with free ports:

- **replicas**: three fake serving replicas (`tests.api.fake_serving`: TF Serving's REST API,
  a cheap model) and the API under gunicorn (`gunicorn.conf.py`, two workers) started under
  an open-files limit of 1024, soft and hard (a common container default). Faults, in order:
  `idle-flood` (2,500 connections that never send a byte), `slowloris` (2,000 connections
  sending their head a byte a second), `huge-headers` (4 clients sending 50 MB headers in
  a loop), `metrics-flood` (16 clients scraping the operational port's `/metrics` back to
  back), `slow-reader` (20 connections pipelining score requests and never reading: cut off,
  worker RSS back within 20 MB), `huge-response` (one replica answering 200 MB bodies: its share 502 at once,
  worker RSS back within 20 MB), `hung-replica` (one replica SIGSTOPped for most of the run), `killed-replica`
  (one SIGKILLed), `killed-worker` (one gunicorn worker SIGKILLed: its in-flight requests
  lost, the rest served, a worker respawned), `sigterm` (the gunicorn master, mid-load).
- **overload-3x**: one fake replica of a known capacity (2 predicts at once, 50 ms each) and
  the API under gunicorn: capacity measured in a closed loop, then three times that offered
  open-loop for `--overload-seconds` (60 s) by `bench.loadgen`: goodput (200s within budget)
  >= 90 % of capacity, every answer within budget + 100 ms, none unanswered, and normal
  latency from 2 s after the burst.
- **events-disk-full**: the API with `EVENTS_JSONL_PATH` on a file system that fills during
  the run: a 1 MiB tmpfs when this process may mount one (root), else a 4 MiB file-size
  limit (RLIMIT_FSIZE) on the API's processes; either way the file is first filled to 48 KiB
  short of the limit.
- **one-container**: `run-server.sh` (the real model server on the example models, the API
  under gunicorn), serving SIGKILLed mid-load.

Expectations (a fault that breaks one makes the run exit 1): nothing lost; no gunicorn
worker restarted; at least 90 % answered 200 within budget, except where the fault takes the
model away (`one-container`: every failure a 503 `serving_unavailable` or a late 200 while
serving restarts on the same CPUs; serving restarted and the API ready again) or the server
itself (`sigterm`: requests after the listener closed are refused; the master exits 0);
`events-disk-full`: no partial line in the file and the written counter equal to the lines
added.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from tests.api.stack import FakeServing, launch_fake, transactions, wait_ready
from tests.chaos.load import LoadResult, OpenLoopLoad
from tests.support import (
    free_port,
    http_ok,
    ops_url,
    run_server_env,
    start_gunicorn,
    start_run_server,
    wait_run_server,
    wait_until,
)
from tools.processes import run_to_exit

BUDGET_S = 1.0
FAULT_AT_S = 1.5  # into the load: the fault starts once the load is steady
MIN_WITHIN_BUDGET = 0.9
EVENTS_HEADROOM = 48 * 1024

FAULTS = (
    "idle-flood",
    "slowloris",
    "huge-headers",
    "metrics-flood",
    "slow-reader",
    "huge-response",
    "hung-replica",
    "killed-replica",
    "killed-worker",
    "sigterm",
    "overload-3x",
    "events-disk-full",
    "one-container",
)


@dataclass
class Outcome:
    """One fault's row: the load's outcomes, workers restarted, notes, broken expectations."""

    name: str
    load: LoadResult
    restarted: int = 0
    notes: list[str] = field(default_factory=list)
    broken: list[str] = field(default_factory=list)

    def expect(self, holds: bool, what: str) -> None:
        if not holds:
            self.broken.append(what)

    def expect_defaults(self, min_within: float = MIN_WITHIN_BUDGET) -> None:
        self.expect(self.load.sent > 0, "the load ran")
        self.expect(self.load.lost == 0, "nothing lost")
        self.expect(self.restarted == 0, "no worker restarted")
        share = self.load.within_budget / max(1, self.load.sent)
        self.expect(share >= min_within, f">= {min_within:.0%} within budget (was {share:.0%})")


def children(pid: int) -> set[int]:
    """Direct children of `pid`."""
    found: set[int] = set()
    with suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            found |= {int(c) for c in (task / "children").read_text().split()}
    return found


class WorkerWatch:
    """Every gunicorn worker pid seen under a master while it runs (polled every 100 ms)."""

    def __init__(self, master: int) -> None:
        self.master = master
        self.initial = children(master)
        self.seen = set(self.initial)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(0.1):
            self.seen |= children(self.master)

    def stop(self) -> int:
        """Stop watching; how many workers appeared that were not there at the start."""
        self._stop.set()
        self._thread.join()
        return len(self.seen - self.initial)


class Gunicorn:
    """The API under gunicorn (`gunicorn.conf.py`), two workers, optionally under limits."""

    def __init__(self, tmp: Path, name: str, serving_urls: str, prlimits: list[str], **env: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        prom = tmp / f"{name}-prometheus"
        prom.mkdir()
        settings = {
            "WEB_CONCURRENCY": "2",
            "API_BIND": f"127.0.0.1:{self.port}",
            "SERVING_URLS": serving_urls,
            "REQUEST_TIMEOUT_S": str(BUDGET_S),
            "API_HEADER_TIMEOUT_S": "2",
            "ACCESS_LOG": "false",
            "PROMETHEUS_MULTIPROC_DIR": str(prom),
            "EVENTS_JSONL_PATH": str(tmp / f"{name}-events.jsonl"),
            **env,
        }
        self.proc = start_gunicorn(tmp / f"{name}.log", prefix=["prlimit", *prlimits], **settings)
        wait_until(lambda: self._ready(), 60, f"API {name}")

    def _ready(self) -> bool:
        assert self.proc.alive(), self.proc.log()
        return http_ok(self.url + "/readyz") and len(children(self.proc.popen.pid)) == 2

    def metric(self, name: str, **labels: str) -> float:
        text = httpx.get(ops_url(self.proc) + "/metrics", timeout=5).text
        pattern = re.escape(name) + r"\{([^}]*)\} ([0-9.e+]+)"
        total = 0.0
        for found_labels, value in re.findall(pattern, text):
            if all(f'{k}="{v}"' in found_labels for k, v in labels.items()):
                total += float(value)
        return total


def ops_port(api: Gunicorn) -> int:
    """The operational port (`API_OPS_BIND`) of the API under gunicorn."""
    return int(urlsplit(ops_url(api.proc)).port or 0)


def under_load(
    name: str,
    url: str,
    master: int | None,
    fault: Callable[[], None],
    *,
    rate: float,
    seconds: float,
    keepalive: int = 8,
) -> Outcome:
    """Run the load, start `fault` at FAULT_AT_S, wait for every outcome."""
    watch = WorkerWatch(master) if master else None
    bodies = transactions(512, seed=31)
    load = OpenLoopLoad(
        url + "/v1/fraud/score", bodies, rate=rate, seconds=seconds, budget_s=BUDGET_S, keepalive=keepalive
    )
    with load:
        time.sleep(FAULT_AT_S)
        fault()
    outcome = Outcome(name, load.result, restarted=watch.stop() if watch else 0)
    print(f"chaos: {name}: {outcome.load.sent} sent, {dict(outcome.load.outcomes)}", flush=True)
    return outcome


def attack(kind: str, port: int, count: int, seconds: float, notes: list[str], **extra: str) -> Callable[[], None]:
    """A fault that runs `python -m tests.chaos.attacks` for `seconds` and notes its counters."""

    def run() -> None:
        args = [sys.executable, "-m", "tests.chaos.attacks", kind, f"--port={port}", f"--count={count}"]
        args += [f"--seconds={seconds}", *(f"--{k}={v}" for k, v in extra.items())]
        out = run_to_exit(args, timeout_s=seconds + 60)
        notes.append(f"attackers: {out.stdout.strip() or out.stderr.strip()[-300:]}")

    return run


# --- the replicas stack ---------------------------------------------------------------------


def replicas_faults(tmp: Path, names: list[str], rate: float, seconds: float) -> Iterator[Outcome]:
    fakes = [launch_fake(tmp, f"replica-{i}") for i in range(3)]
    api: Gunicorn | None = None
    try:
        wait_ready(*fakes)
        api = Gunicorn(tmp, "api", ",".join(f.url for f in fakes), ["--nofile=1024:1024"])
        master = api.proc.popen.pid
        attack_s = seconds - FAULT_AT_S
        plan: list[tuple[str, Callable[[list[str]], Callable[[], None]]]] = [
            ("idle-flood", lambda notes: attack("idle", api.port, 2500, attack_s, notes)),
            ("slowloris", lambda notes: attack("slow", api.port, 2000, attack_s, notes)),
            ("huge-headers", lambda notes: attack("huge", api.port, 4, attack_s, notes, **{"header-mb": "50"})),
            # Scrapes back to back on the operational port: scoring and probes unaffected.
            ("metrics-flood", lambda notes: attack("scrape", ops_port(api), 16, attack_s, notes)),
            ("slow-reader", lambda notes: attack("unread", api.port, 20, attack_s, notes)),
            ("huge-response", lambda notes: huge_response(fakes[0], attack_s - 1.0, notes)),
            ("hung-replica", lambda notes: hang(fakes[1], attack_s - 1.0, notes)),
            ("killed-replica", lambda notes: kill(fakes[2], notes)),
            ("killed-worker", lambda notes: kill_worker(master, notes)),
        ]
        for name, make in plan:
            if name in names:
                notes: list[str] = []
                before = workers_rss_mb(master)
                outcome = under_load(name, api.url, master, make(notes), rate=rate, seconds=seconds)
                outcome.notes += notes
                if name == "killed-worker":
                    # What that worker had in flight is lost with it (a SIGKILL); the other
                    # worker, the respawned one and the probes must not wait on it.
                    outcome.expect(outcome.load.lost <= MAX_IN_FLIGHT_PER_WORKER, "lost at most its requests in flight")
                    outcome.expect(outcome.restarted == 1, "one worker respawned")
                    share = outcome.load.within_budget / max(1, outcome.load.sent)
                    outcome.expect(share >= MIN_WITHIN_BUDGET, f">= 90% within budget (was {share:.0%})")
                    outcome.expect(http_ok(api.url + "/readyz") and len(children(master)) == 2, "ready, 2 workers")
                elif name == "huge-response":
                    # One replica of three faulty: its third of the answers is 502 at once,
                    # and the workers hold none of its bodies afterwards.
                    outcome.expect(outcome.load.lost == 0, "nothing lost")
                    outcome.expect(outcome.restarted == 0, "no worker restarted")
                    failed = outcome.load.failed()
                    outcome.expect(set(failed) <= {"502"}, f"every failure a 502 (were {failed})")
                    after = settled_rss_mb(master, before)
                    outcome.notes.append(f"worker RSS MB before {before}, after {after}")
                    outcome.expect(
                        all(after.get(pid, 0) - mb <= RSS_SLACK_MB for pid, mb in before.items()),
                        f"worker RSS back within {RSS_SLACK_MB} MB of its baseline",
                    )
                else:
                    outcome.expect_defaults()
                if name == "slow-reader":
                    after = settled_rss_mb(master, before)
                    outcome.notes.append(f"worker RSS MB before {before}, after {after}")
                    outcome.expect(
                        all(after.get(pid, 0) - mb <= RSS_SLACK_MB for pid, mb in before.items()),
                        f"worker RSS back within {RSS_SLACK_MB} MB of its baseline",
                    )
                yield outcome
        if "sigterm" in names:
            # Every connection kept alive: a request sent on one just as the worker shuts down
            # must be answered (a new connection still queued in the listening socket's
            # accept queue when it closes is reset by the kernel, which no server can avoid).
            outcome = under_load("sigterm", api.url, master, lambda: os.kill(master, signal.SIGTERM), rate=rate,
                                 seconds=seconds, keepalive=32)  # fmt: skip
            code = api.proc.popen.wait(30)
            refused = outcome.load.outcomes["refused"] + outcome.load.outcomes["connect_timeout"]
            outcome.notes.append(f"master exit status {code}; {refused} refused after the listener closed")
            outcome.expect(outcome.load.sent > 0, "the load ran")
            outcome.expect(code == 0, "gunicorn exits 0")
            outcome.expect(outcome.load.lost == 0, "nothing lost")
            answered = outcome.load.sent - refused
            outcome.expect(
                outcome.load.within_budget >= MIN_WITHIN_BUDGET * answered, ">= 90 % of those not refused within budget"
            )
            yield outcome
    finally:
        if api is not None:
            api.proc.stop()
        for fake in fakes:
            with suppress(ProcessLookupError):
                os.kill(fake.proc.popen.pid, signal.SIGCONT)
            fake.proc.stop()


RSS_SLACK_MB = 20


def workers_rss_mb(master: int) -> dict[int, int]:
    """Each gunicorn worker's resident set (VmRSS), MB, by pid."""
    found: dict[int, int] = {}
    for pid in children(master):
        with suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    found[pid] = int(line.split()[1]) // 1024
    return found


def settled_rss_mb(master: int, before: dict[int, int], within_s: float = 10.0) -> dict[int, int]:
    """The workers' RSS once back within RSS_SLACK_MB of `before`, or as it is after `within_s`."""
    deadline = time.monotonic() + within_s
    while True:
        now = workers_rss_mb(master)
        settled = all(now.get(pid, 0) - mb <= RSS_SLACK_MB for pid, mb in before.items())
        if settled or time.monotonic() >= deadline:
            return now
        time.sleep(0.5)


def huge_response(fake: FakeServing, for_s: float, notes: list[str]) -> Callable[[], None]:
    """A fault: `fake` answers every Predict with a 200 MB body for `for_s`, then heals."""

    def run() -> None:
        httpx.post(fake.url + "/_fake/huge", params={"bytes": str(200 << 20)}, timeout=5).raise_for_status()
        time.sleep(for_s)
        httpx.post(fake.url + "/_fake/huge", params={"bytes": "0"}, timeout=5).raise_for_status()
        notes.append(f"one replica of three answered 200 MB bodies for {for_s:.1f} s")

    return run


MAX_IN_FLIGHT_PER_WORKER = 64  # MAX_IN_FLIGHT_REQUESTS' default


def kill_worker(master: int, notes: list[str]) -> Callable[[], None]:
    """A fault: SIGKILL one gunicorn worker mid-load. Not timed to the moment it holds the
    in-flight board's record lock (tests/api/test_in_flight.py kills a holder on purpose);
    here: the whole system around a worker that dies with its shared state half-used."""

    def run() -> None:
        victim = min(children(master))
        os.kill(victim, signal.SIGKILL)
        notes.append(f"worker {victim} SIGKILLed")

    return run


def hang(fake: FakeServing, for_s: float, notes: list[str]) -> Callable[[], None]:
    def run() -> None:
        os.kill(fake.proc.popen.pid, signal.SIGSTOP)
        time.sleep(for_s)
        os.kill(fake.proc.popen.pid, signal.SIGCONT)
        notes.append(f"replica SIGSTOPped for {for_s:.1f} s of the run, then SIGCONT")

    return run


def kill(fake: FakeServing, notes: list[str]) -> Callable[[], None]:
    def run() -> None:
        fake.proc.popen.kill()
        notes.append("one of three replicas SIGKILLed, not restarted")

    return run


# --- 3x overload -----------------------------------------------------------------------------

# The bottleneck is serving, held to a known capacity: one fake replica running 2 predicts at
# once, 50 ms each (about 40 per second), coalescing off so each score is one predict. The
# load is the benchmark's generator (`bench.loadgen`, its own process, ~25 us of CPU a
# request): httpx in this process, at ~2 ms a request, fell behind its own timetable at a few
# hundred per second on 2 busy cores and its queue showed up as 30 s "latencies". The
# in-flight limit follows Little's law: 12 per worker, 24 in all, wait at most 24 / 40 = 0.6 s
# at the replica, inside the 1 s budget; past it a request is answered 503 at once.
OVERLOAD_SERVICE_MS = 50
OVERLOAD_SLOTS = 2
OVERLOAD_IN_FLIGHT = 12
OVERLOAD_FACTOR = 3.0
PROBE_CONNECTIONS = 8  # above the replica's 2 slots, below the 24 in flight
PROBE_S = 4.0
ANSWER_SLACK_S = 0.1  # every answer within budget + this
SETTLE_S = 2.0  # normal latency again this long after the burst
AFTER_S = 4.0


def loadgen(url: str, pool: Path, *args: str, seconds: float) -> dict[str, Any]:
    """`python -m bench.loadgen` against `url` with `args`; its JSON result."""
    done = run_to_exit([sys.executable, "-m", "bench.loadgen", f"--url={url}", f"--pool={pool}", *args,
                        f"--duration={seconds}"], timeout_s=seconds + 60)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"bench.loadgen failed: {done.stderr.strip()[-500:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def overload(tmp: Path, seconds: float) -> Outcome:
    """Measure capacity in a closed loop, offer 3x that open-loop for `seconds`, then half of
    it from 2 s after the burst: goodput >= 90 % of capacity, every request answered within
    budget + 100 ms, none unanswered, normal latency after."""
    fake = launch_fake(tmp, "overload-serving", None, 0, f"--service-ms={OVERLOAD_SERVICE_MS}",
                       f"--slots={OVERLOAD_SLOTS}")  # fmt: skip
    api: Gunicorn | None = None
    try:
        wait_ready(fake)
        api = Gunicorn(tmp, "api-overload", fake.url, ["--nofile=1024:1024"], COALESCING_ENABLED="false",
                       MAX_IN_FLIGHT_REQUESTS=str(OVERLOAD_IN_FLIGHT))  # fmt: skip
        url = api.url + "/v1/fraud/score"
        pool = tmp / "overload-bodies.jsonl"
        pool.write_text("".join(json.dumps(body) + "\n" for body in transactions(512, seed=37)))
        probe = loadgen(url, pool, "--closed", f"--connections={PROBE_CONNECTIONS}", seconds=PROBE_S)
        capacity = probe["achieved_rps"]
        baseline_ms = (probe["latency"] or {}).get("p50_ms", 0.0)
        offered = OVERLOAD_FACTOR * capacity
        print(f"chaos: overload-3x: capacity {capacity:.0f}/s, offering {offered:.0f}/s for {seconds:.0f} s",
              flush=True)  # fmt: skip
        budget_ms = BUDGET_S * 1000
        watch = WorkerWatch(api.proc.popen.pid)
        after: dict[str, Any] = {}

        def after_burst() -> None:
            time.sleep(seconds + SETTLE_S)
            after.update(loadgen(url, pool, "--open", f"--rate={capacity / 2}", f"--slo-ms={budget_ms}",
                                 "--timeout=5", "--seed=2", seconds=AFTER_S))  # fmt: skip

        later = threading.Thread(target=after_burst, daemon=True)
        later.start()
        burst = loadgen(url, pool, "--open", f"--rate={offered}", f"--slo-ms={budget_ms}", "--timeout=5",
                        "--max-connections=512", seconds=seconds)  # fmt: skip
        later.join(SETTLE_S + AFTER_S + 60)
        errors, statuses = burst["errors"], burst["statuses"]
        within = burst["ok"] - burst["late"]
        unanswered = errors["connect"] + errors["read"] + errors["timeout"]
        result = LoadResult(sent=burst["planned"])
        result.outcomes.update({"ok": within, "late": burst["late"], "lost": unanswered, **statuses})
        outcome = Outcome("overload-3x", result, restarted=watch.stop())
        goodput = within / seconds / max(capacity, 1e-9)
        other = sum(n for code, n in statuses.items() if code not in ("503", "504")) + burst["late"]
        after_p50 = (after.get("latency") or {}).get("p50_ms", float("inf"))
        after_within = after.get("ok", 0) - after.get("late", 0)
        outcome.notes.append(
            f"capacity {capacity:.0f}/s (closed loop, {PROBE_CONNECTIONS} connections, {PROBE_S:.0f} s, p50 "
            f"{baseline_ms:.0f} ms); offered {offered:.0f}/s for {seconds:.0f} s (bench.loadgen, generator lag p99 "
            f"{burst['generator_lag_p99_ms']:.1f} ms): sent {burst['sent']}, 200 within budget {within}, 503 "
            f"{statuses.get('503', 0)}, 504 {statuses.get('504', 0)}, other {other}, unanswered {unanswered}, "
            f"goodput {goodput:.0%} of capacity, slowest answer {burst['slowest_ms']:.0f} ms; from {SETTLE_S:.0f} s "
            f"after the burst at half capacity: {after_within} of {after.get('planned', 0)} within budget, p50 "
            f"{after_p50:.0f} ms"
        )
        outcome.expect(burst["sent"] > 0, "the load ran")
        outcome.expect(outcome.restarted == 0, "no worker restarted")
        outcome.expect(goodput >= MIN_WITHIN_BUDGET, f"goodput >= 90 % of capacity (was {goodput:.0%})")
        outcome.expect(unanswered == 0 and burst["sent"] == burst["planned"], "none unanswered")
        outcome.expect(
            burst["slowest_ms"] <= budget_ms + ANSWER_SLACK_S * 1000,
            f"every answer within budget + 100 ms (slowest {burst['slowest_ms']:.0f} ms)",
        )
        outcome.expect(
            after.get("planned", 0) > 0 and after_within == after["planned"]
            and after_p50 <= max(2 * baseline_ms, baseline_ms + 50),
            "normal latency 2 s after the burst",
        )  # fmt: skip
        return outcome
    finally:
        if api is not None:
            api.proc.stop()
        fake.proc.stop()


# --- the full events disk ---------------------------------------------------------------------


@contextmanager
def small_file_system(tmp: Path) -> Iterator[tuple[Path, int, list[str], str]]:
    """(directory, size limit in bytes, prlimit flags, what was used) for the events file."""
    mount = tmp / "events-fs"
    mount.mkdir()
    size = 1 << 20
    mounted = False
    if os.geteuid() == 0:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True)
        mounted = done.returncode == 0
    try:
        if mounted:
            yield mount, size, ["--nofile=1024:1024"], "a 1 MiB tmpfs"
        else:
            size = 4 << 20  # above prometheus-client's 1 MiB multiprocess files
            yield mount, size, ["--nofile=1024:1024", f"--fsize={size}"], "a 4 MiB file-size limit (RLIMIT_FSIZE)"
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def events_disk_full(tmp: Path, rate: float, seconds: float) -> Outcome:
    fake = launch_fake(tmp, "events-serving")
    try:
        wait_ready(fake)
        with small_file_system(tmp) as (directory, size, prlimits, used):
            events = directory / "events.jsonl"
            line = b'{"prefill": true, "pad": "' + b"x" * 200 + b'"}\n'
            prefill = (size - EVENTS_HEADROOM) // len(line)
            with suppress(OSError):
                events.write_bytes(line * prefill)
            api = Gunicorn(tmp, "api-disk", fake.url, prlimits, EVENTS_JSONL_PATH=str(events))
            try:
                outcome = under_load("events-disk-full", api.url, api.proc.popen.pid, lambda: None, rate=rate,
                                     seconds=seconds)  # fmt: skip
                time.sleep(1.0)  # the last batches leave the queue
                written = api.metric("api_score_events_total", outcome="written")
                dropped = api.metric("api_score_events_total", outcome="dropped_sink_error")
            finally:
                api.proc.stop()
            data = events.read_bytes()
        lines = data.split(b"\n")
        whole = data.endswith(b"\n")
        parsed = 0
        for raw in lines[prefill:-1]:
            with suppress(ValueError):
                json.loads(raw)
                parsed += 1
        added = len(lines) - 1 - prefill
        outcome.notes.append(
            f"{used}; {added} events in the file, counters: {written:.0f} written, {dropped:.0f} dropped_sink_error"
        )
        outcome.expect_defaults()
        outcome.expect(whole and parsed == added, "no partial line in the events file")
        outcome.expect(dropped > 0, "the disk filled during the run")
        # Counted before shutdown; the shutdown drain may add the last few to the file.
        outcome.expect(added - 5 <= written <= added, "the written counter equals the lines added")
        return outcome
    finally:
        fake.proc.stop()


# --- one container: run-server.sh -----------------------------------------------------------------


def one_container(tmp: Path, rate: float, seconds: float) -> Outcome:
    env = run_server_env(
        WEB_CONCURRENCY="2",
        REQUEST_TIMEOUT_S=str(BUDGET_S),
        ACCESS_LOG="false",
        EVENTS_JSONL_PATH=str(tmp / "one-container-events.jsonl"),
    )
    api_port = int(env["API_PORT"])
    proc = start_run_server(tmp / "run-server.log", **env)
    url = f"http://127.0.0.1:{api_port}"
    try:
        wait_run_server(proc, 240)
        gunicorn = next(p for p in children(proc.popen.pid) if b"gunicorn" in Path(f"/proc/{p}/cmdline").read_bytes())
        serving = next(p for p in children(proc.popen.pid) if p != gunicorn)

        outcome = under_load("one-container", url, gunicorn, lambda: os.kill(serving, signal.SIGKILL), rate=rate,
                             seconds=seconds)  # fmt: skip
        recovered = True
        try:
            wait_until(lambda: http_ok(url + "/readyz"), 120, "serving back")
        except TimeoutError:
            recovered = False
        log = proc.log_path.read_text()
        restarts = log.count("restarting it in")
        outcome.notes.append(f"serving SIGKILLed; restarted {restarts} time(s); API ready again: {recovered}")
        outcome.expect(outcome.load.sent > 0, "the load ran")
        outcome.expect(outcome.load.lost == 0, "nothing lost")
        outcome.expect(outcome.restarted == 0, "no worker restarted")
        # Restarting serving costs the container's CPU (TensorFlow's import, the model's
        # load): answers may come late meanwhile; any failure is the 503 of a missing model.
        outcome.expect(set(outcome.load.failed()) <= {"503", "late"}, "every failure a 503")
        outcome.expect(proc.alive() and restarts == 1 and recovered, "serving restarted, the API ready again")
        return outcome
    finally:
        proc.stop(timeout_s=60)


def run_faults(names: list[str], *, rate: float, seconds: float, overload_s: float = 60.0) -> list[Outcome]:
    """Run the named faults (in `FAULTS` order); their outcomes."""
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp_dir:
        tmp = Path(tmp_dir)
        if set(names) & set(FAULTS[: FAULTS.index("sigterm") + 1]):  # the replicas stack
            outcomes += replicas_faults(tmp, names, rate, seconds)
        if "overload-3x" in names:
            outcomes.append(overload(tmp, overload_s))
        if "events-disk-full" in names:
            outcomes.append(events_disk_full(tmp, rate, seconds))
        if "one-container" in names:
            outcomes.append(one_container(tmp, rate, max(seconds, 15.0)))
    return outcomes
