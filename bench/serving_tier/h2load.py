"""h2load as the gRPC load generator: its command line, running it, reading its report.

Unary gRPC calls are plain HTTP/2 POSTs (cleartext, prior knowledge) to the Predict method with
``content-type: application/grpc`` and ``te: trailers``, whose body is the gRPC length-prefixed
message (:func:`bench.serving_tier.workload.grpc_frame`).
"""

from __future__ import annotations

import functools
import re
import resource
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.load import LoadToolError
from bench.processes import REPO, taskset
from bench.serving_tier.workload import CALL_TIMEOUT_S

H2LOAD_INSTALL_HINT = "h2load is not on PATH; on Debian/Ubuntu: apt-get install nghttp2-client"


def parse_time_ms(text: str) -> float:
    """A load tool's time ("812.00us", "1.23ms", "2.00s", "1.00m") in milliseconds.

    Raises:
        ValueError: not such a time.
    """
    match = re.fullmatch(r"([0-9.]+)(us|ms|s|m|h)", text.strip())
    if not match:
        raise ValueError(f"not a time: {text!r}")
    return float(match.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3}[
        match.group(2)
    ]


@dataclass(frozen=True)
class H2loadSummary:
    """What h2load prints at the end of a timing-based (``-D``) run; counts cover the main
    duration only (not the warm-up), times are milliseconds."""

    protocol: str | None  # "h2c" once a connection was made ("Application protocol:"), or None
    rps: float  # h2load's "req/s": completed streams (any status) / the -D duration
    total: int
    started: int
    done: int
    succeeded: int  # answers with an HTTP status < 400 (h2load's req_status_success)
    failed: int
    errored: int
    timeout: int
    status: dict[str, int]  # "2xx", "3xx", "4xx", "5xx" -> answers
    data_bytes: int  # response DATA (gRPC messages), headers and trailers not included
    latency_min_ms: float
    latency_max_ms: float
    latency_mean_ms: float
    latency_sd_ms: float

    @property
    def errors(self) -> dict[str, int]:
        """The non-zero failure counters: failed, errored, timeout and non-2xx statuses."""
        counts = {"failed": self.failed, "errored": self.errored, "timeout": self.timeout}
        counts.update({f"http {k}": v for k, v in self.status.items() if k != "2xx"})
        return {k: v for k, v in counts.items() if v}


def parse_h2load(text: str) -> H2loadSummary:
    """Parse h2load's (nghttp2 1.x) closing report.

    h2load has no latency percentiles: "time for request" gives min, max, mean and sd only.

    Raises:
        LoadToolError: the report's "req/s", "requests:", "status codes:" or "time for
            request:" line is missing.
    """
    rps = re.search(r"^finished in \S+, ([0-9.]+) req/s", text, re.M)
    requests = re.search(
        r"^requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, "
        r"(\d+) errored, (\d+) timeout",
        text,
        re.M,
    )
    status = re.search(r"^status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", text, re.M)
    latency = re.search(r"^time for request:\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)", text, re.M)
    if not (rps and requests and status and latency):
        raise LoadToolError(f"h2load printed no report:\n{text[-2000:]}")
    data = re.search(r"^traffic: .*, \S+ \((\d+)\) data", text, re.M)
    protocol = re.search(r"^Application protocol: (\S+)", text, re.M)
    total, started, done, succeeded, failed, errored, timeout = map(int, requests.groups())
    return H2loadSummary(
        protocol=protocol[1] if protocol else None,
        rps=float(rps[1]),
        total=total,
        started=started,
        done=done,
        succeeded=succeeded,
        failed=failed,
        errored=errored,
        timeout=timeout,
        status=dict(zip(("2xx", "3xx", "4xx", "5xx"), map(int, status.groups()), strict=True)),
        data_bytes=int(data[1]) if data else 0,
        latency_min_ms=parse_time_ms(latency[1]),
        latency_max_ms=parse_time_ms(latency[2]),
        latency_mean_ms=parse_time_ms(latency[3]),
        latency_sd_ms=parse_time_ms(latency[4]),
    )


def _h2load_duration(seconds: float) -> str:
    """h2load's <DURATION>: an integer with a unit; milliseconds, at least 1."""
    return f"{max(1, round(seconds * 1000))}ms"


@functools.cache
def h2load_info(path: str) -> tuple[str, bool]:
    """(version line, whether it has ``--warm-up-time``) of the h2load at ``path``."""
    version = subprocess.run(
        [path, "--version"], capture_output=True, text=True, timeout=10, check=False
    ).stdout.strip()
    usage = subprocess.run(
        [path, "--help"], capture_output=True, text=True, timeout=10, check=False
    ).stdout
    return version or "h2load (unknown version)", "--warm-up-time" in usage


def h2load_command(
    h2load: str,
    url: str,
    body: Path,
    *,
    connections: int,
    streams: int,
    duration_s: float,
    warmup_s: float,
    cpus: Sequence[int],
) -> list[str]:
    """h2load's closed loop of unary gRPC calls: ``connections`` x ``streams`` in flight, for
    ``duration_s`` seconds after ``warmup_s`` (0: no ``--warm-up-time``), one thread per CPU
    in ``cpus`` (at most one per connection), pinned to them."""
    command = [
        *taskset(cpus),
        h2load,
        f"--clients={connections}",
        f"--max-concurrent-streams={streams}",
        f"--threads={max(1, min(len(cpus) or 1, connections))}",
        f"--duration={_h2load_duration(duration_s)}",
    ]
    if warmup_s > 0:
        command.append(f"--warm-up-time={_h2load_duration(warmup_s)}")
    return [
        *command,
        # A connection silent this long is closed and its calls counted as errors.
        f"--connection-inactivity-timeout={_h2load_duration(CALL_TIMEOUT_S)}",
        f"--data={body}",
        "--header=content-type: application/grpc",
        "--header=te: trailers",
        url,
    ]


def run_tool(args: Sequence[str], timeout_s: float) -> tuple[str, float]:
    """Run a load tool to completion: (stdout + stderr, its CPU in cores from the children's
    rusage delta over the wall time).

    Raises:
        LoadToolError: it exited non-zero or did not finish within ``timeout_s``.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    try:
        done = subprocess.run(
            args, cwd=REPO, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise LoadToolError(f"{args[0]} did not finish within {timeout_s:.0f}s") from exc
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        output = (done.stderr.strip() or done.stdout.strip())[-2000:]
        raise LoadToolError(f"{' '.join(args)} exited {done.returncode}: {output}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return done.stdout + done.stderr, cpu / wall if wall > 0 else 0.0


