"""Wait until the API answers `GET /readyz` 200, saying why not meanwhile (`run-server.sh`).

    python -m api.ops.readiness_wait http://127.0.0.1:8000/readyz --timeout-s 180

Polls `/readyz` with a growing interval (`FIRST_INTERVAL_S`, doubling up to
`MAX_INTERVAL_S`): a start that takes a second is seen at once, and an API that never gets
ready costs one access-log line every 2 s rather than five a second. Each time the reason
the API gives changes (the 503's `detail`, e.g. `not ready: fraud: version 1 has no
signature 'scores' (it has: serving_default)`), one line says so on stderr: the reason is
printed once per change, not per poll.

Exit status: 0 ready; 2 not ready within `--timeout-s`, the last reason then recorded for
run-server.sh's last line (`api.ops.start_failure`). (`run-server.sh` also stops it when the
API exits.) Stdlib only: it runs before, and beside, the API.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Final

from api.ops import start_failure

FIRST_INTERVAL_S: Final = 0.25
MAX_INTERVAL_S: Final = 2.0
PROBE_TIMEOUT_S: Final = 5.0


def probe(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> tuple[bool, str | None]:
    """One `GET url`: (ready, why not).

    Returns:
        (True, None) on a 2xx; (False, the answer's `detail`, else its status) on any
        other answer; (False, None) when nothing answered (not listening yet, no answer
        within `timeout_s`).
    """
    try:
        with urllib.request.urlopen(url, timeout=timeout_s):
            return True, None
    except urllib.error.HTTPError as answer:
        try:
            detail = json.loads(answer.read()).get("detail")
        except (ValueError, AttributeError, OSError):
            detail = None
        return False, str(detail) if detail else f"HTTP {answer.code}"
    except (OSError, ValueError):  # URLError, refused, reset, timed out
        return False, None


def wait_ready(
    url: str,
    *,
    timeout_s: float,
    report: Callable[[str], None],
    probe: Callable[[str], tuple[bool, str | None]] = probe,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Poll `url` until ready (0) or `timeout_s` passed (2).

    `report(reason)` is called with each new reason the API gives for not being ready,
    never twice in a row with the same one.
    """
    deadline = clock() + timeout_s
    interval = FIRST_INTERVAL_S
    last: str | None = None
    while True:
        ready, reason = probe(url)
        if ready:
            return 0
        if reason is not None and reason != last:
            report(reason)
            last = reason
        if clock() >= deadline:
            return 2
        sleep(min(interval, max(0.0, deadline - clock())))
        interval = min(interval * 2, MAX_INTERVAL_S)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="the API's /readyz URL")
    parser.add_argument("--timeout-s", type=float, required=True, help="give up after this long, seconds")
    parser.add_argument("--log-prefix", default="run-server: ", help="prefix of each line written")
    args = parser.parse_args(argv)

    def report(reason: str) -> None:
        print(f"{args.log_prefix}API not ready yet: {reason}", file=sys.stderr, flush=True)

    reasons: list[str] = []

    def report_and_keep(reason: str) -> None:
        reasons.append(reason)
        report(reason)

    code = wait_ready(args.url, timeout_s=args.timeout_s, report=report_and_keep)
    if code != 0:
        # run-server.sh prints it as its last line, once both tiers are stopped.
        start_failure.record(f"not ready: {reasons[-1]}" if reasons else "no answer from /readyz")
    return code


if __name__ == "__main__":
    sys.exit(main())
