"""Starting, watching and stopping the processes of one setup, on 127.0.0.1.

Each process gets its own session (process group), so stopping it also stops the
workers it forked, and its output goes to a log file in the run's results folder.
Readiness is always waited for by polling a condition with a deadline, never by a
fixed sleep.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]


class SetupError(RuntimeError):
    """A setup's process failed to start, died, or did not become ready in time."""


def taskset(cpus: Sequence[int]) -> list[str]:
    """`taskset -c CPUS` to prefix a command with; nothing for no CPUs (not pinned)."""
    return ["taskset", "-c", ",".join(map(str, cpus))] if cpus else []


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Process:
    """A child process started in its own session, output in `log_path`."""

    def __init__(
        self,
        name: str,
        args: Sequence[str],
        log_path: Path,
        env: dict[str, str] | None = None,
    ) -> None:
        """Start `args` in the repository root with `env` added to this environment."""
        self.name = name
        self.args = list(args)
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.popen = subprocess.Popen(
            self.args,
            cwd=REPO,
            env={**os.environ, **(env or {})},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        """The process id (the root of its tree)."""
        return self.popen.pid

    def alive(self) -> bool:
        """True while the process has not exited."""
        return self.popen.poll() is None

    def log(self, tail_chars: int = 3000) -> str:
        """The end of its output."""
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-tail_chars:]

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """SIGTERM, wait `timeout_s`, then SIGKILL its process group. Returns the exit code."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.popen.wait(5.0)
        if not self._log.closed:
            self._log.close()
        return self.popen.returncode


def wait_until(
    predicate: Callable[[], bool],
    *,
    timeout_s: float,
    what: str,
    watch: Sequence[Process] = (),
    poll_s: float = 0.1,
) -> None:
    """Poll `predicate` until true.

    Raises:
        SetupError: after `timeout_s` seconds, or as soon as a watched process exits
            (with the end of its log).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return
        for proc in watch:
            if not proc.alive():
                raise SetupError(
                    f"{proc.name} exited ({proc.popen.returncode}) while waiting for {what}:\n"
                    f"{proc.log()}"
                )
        if time.monotonic() >= deadline:
            logs = "\n".join(f"--- {p.name}:\n{p.log(1500)}" for p in watch)
            raise SetupError(f"timed out after {timeout_s:.0f}s waiting for {what}\n{logs}")
        time.sleep(poll_s)


def log_count(proc: Process, needle: str) -> int:
    """How many times `needle` occurs in the process's log so far."""
    return proc.log(tail_chars=10_000_000).count(needle)


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
