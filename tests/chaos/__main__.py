"""`make chaos`: the API under faults and hostile clients, as real processes on loopback.

    python -m tests.chaos                 # every fault, about 4 minutes on 2 cores
    python -m tests.chaos --only hung-replica,killed-replica --rate 80

Each fault runs under an open-loop load of fraud scores (`tests.chaos.load`: `--rate`
requests per second for `--seconds`, a 1 s budget each) and prints one row: requests sent,
answered 200 within budget, failed by kind, lost (sent and never answered) and gunicorn
workers restarted. Exits 1 when a fault breaks its expectation (see `tests.chaos.faults`).
"""

from __future__ import annotations

import argparse
import platform
import resource
import sys
import time
from pathlib import Path

from tests.chaos.faults import FAULTS, Outcome, run_faults


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def table(outcomes: list[Outcome]) -> str:
    header = ("fault", "sent", "within budget", "failed by kind", "lost", "workers restarted", "expectation")
    rows = [header]
    for o in outcomes:
        failed = ", ".join(f"{k}: {v}" for k, v in o.load.failed().items()) or "-"
        verdict = "held" if not o.broken else "NOT held: " + "; ".join(o.broken)
        rows.append(
            (o.name, str(o.load.sent), str(o.load.within_budget), failed, str(o.load.lost), str(o.restarted), verdict)
        )
    lines = ["| " + " | ".join(r) + " |" for r in rows]
    lines.insert(1, "|" + "|".join("---" for _ in header) + "|")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help=f"comma-separated faults: {', '.join(FAULTS)}")
    parser.add_argument("--rate", type=float, default=100.0, help="requests per second of the load")
    parser.add_argument("--seconds", type=float, default=8.0, help="load duration per fault")
    parser.add_argument("--overload-seconds", type=float, default=60.0, help="the 3x overload's burst")
    args = parser.parse_args()
    only = [f for f in args.only.split(",") if f]
    unknown = set(only) - set(FAULTS)
    if unknown:
        parser.error(f"unknown faults: {', '.join(sorted(unknown))}")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the load and attack sockets
    started = time.monotonic()
    print(f"chaos: CPU {cpu_model()}, {len(__import__('os').sched_getaffinity(0))} CPUs", flush=True)
    outcomes = run_faults(only or list(FAULTS), rate=args.rate, seconds=args.seconds, overload_s=args.overload_seconds)
    print()
    print(table(outcomes))
    for o in outcomes:
        for note in o.notes:
            print(f"- {o.name}: {note}")
    print(f"\nchaos: {time.monotonic() - started:.0f} s")
    return 1 if any(o.broken for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
