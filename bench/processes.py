"""What the benchmark adds to the shared process helpers (`tools.processes`).

Its processes are `tools.processes.Process`es: each in its own session (process group), so
stopping it also stops the workers it forked, its output in a log file in the run's results
folder, readiness waited for by polling a condition with a deadline (`wait_until`), never by a
fixed sleep. Here: CPU pinning (`taskset`), log and HTTP probes, and the benchmark's error.
"""

from __future__ import annotations

from collections.abc import Sequence

import httpx

from tools.processes import REPO, Process, StartError

__all__ = ["REPO", "Probe", "SetupError", "get_contains", "log_count", "taskset"]

SetupError = StartError
"""A setup's process failed to start, died, or did not become ready in time (what
`tools.processes.wait_until` raises), or the benchmark cannot run a setup."""


def taskset(cpus: Sequence[int]) -> list[str]:
    """`taskset -c CPUS` to prefix a command with; nothing for no CPUs (not pinned)."""
    return ["taskset", "-c", ",".join(map(str, cpus))] if cpus else []


def log_count(proc: Process, needle: str) -> int:
    """How many times `needle` occurs in the process's log so far."""
    return proc.log(None).count(needle)


class Probe:
    """POSTs one JSON body to a URL; remembers the last answer for error messages."""

    def __init__(self, url: str, body: bytes, timeout_s: float = 10.0) -> None:
        self.url = url
        self.body = body
        self.timeout_s = timeout_s
        self.last = "no answer yet"

    def __call__(self) -> bool:
        """True when the POST is answered 2xx."""
        try:
            answer = httpx.post(
                self.url,
                content=self.body,
                headers={"content-type": "application/json"},
                timeout=self.timeout_s,
            )
        except httpx.HTTPError as exc:
            self.last = f"{type(exc).__name__}: {exc}"
            return False
        self.last = f"{answer.status_code} {answer.text[:300]}"
        return answer.is_success


def get_contains(url: str, needle: str, timeout_s: float = 2.0) -> bool:
    """True when GET `url` answers 2xx with `needle` in the body."""
    try:
        answer = httpx.get(url, timeout=timeout_s)
    except httpx.HTTPError:
        return False
    return answer.is_success and needle in answer.text
