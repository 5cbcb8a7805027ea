"""Helpers for tests that start real processes on loopback."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
# The example routes (examples/), as `make run` enables them; the API processes below serve them
# unless a test sets MODEL_ROUTES itself.
EXAMPLE_ROUTES = "examples.fraud.route:route,examples.digits.route:route"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll `predicate` every 50 ms until it is true; fail after `timeout_s` seconds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")


def children_running(pid: int, module: str) -> set[int]:
    """The live child processes of ``pid`` whose command line names ``module`` (``-m module``),
    from ``/proc/<pid>/task/*/children``."""
    pids = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # threads and processes come and go
            for child in (task / "children").read_text().split():
                with contextlib.suppress(FileNotFoundError):
                    if module.encode() in Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0"):
                        pids.add(int(child))
    return pids


def http_ok(url: str) -> bool:
    """True when GET url answers 2xx within 1 s."""
    try:
        return httpx.get(url, timeout=1.0).is_success
    except httpx.HTTPError:
        return False


class Proc:
    """A child process with its output in a log file; stopped with SIGTERM."""

    def __init__(self, args: Sequence[str], log_path: Path, env: dict[str, str] | None = None):
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.popen = subprocess.Popen(
            list(args),
            cwd=REPO,
            env={**os.environ, **(env or {})},
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self, timeout_s: float = 20.0) -> int:
        """SIGTERM, wait; SIGKILL if it does not exit in `timeout_s`. Returns the exit code."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self._log.close()
        return self.popen.returncode


def start_serving(
    config_file: Path, rest_port: int, grpc_port: int, log_path: Path, *extra: str
) -> Proc:
    """`python -m serving` on 127.0.0.1 with TF Serving's flags."""
    return Proc(
        [
            sys.executable,
            "-m",
            "serving",
            f"--port={grpc_port}",
            "--grpc_host=127.0.0.1",
            f"--rest_api_port={rest_port}",
            "--rest_api_host=127.0.0.1",
            f"--model_config_file={config_file}",
            *extra,
        ],
        log_path,
    )


def start_api(port: int, serving_url: str, log_path: Path, **env: str) -> Proc:
    """One uvicorn process serving `api.app:create_app` on 127.0.0.1."""
    return Proc(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "--factory",
            "api.app:create_app",
            "--host=127.0.0.1",
            f"--port={port}",
            "--log-level=warning",
        ],
        log_path,
        env={"SERVING_URL": serving_url, "MODEL_ROUTES": EXAMPLE_ROUTES, **env},
    )


def start_gunicorn(log_path: Path, **env: str) -> Proc:
    """The API under gunicorn as deployed: `gunicorn -c gunicorn.conf.py 'api.app:create_app()'`
    (bind it with API_BIND)."""
    return Proc(
        [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py", "api.app:create_app()"],
        log_path,
        env={"MODEL_ROUTES": EXAMPLE_ROUTES, **env},
    )


def local_models_config(tmp_dir: Path) -> Path:
    """models.config with its /models/ prefix pointed at this checkout's models/."""
    text = (REPO / "models.config").read_text().replace('"/models/', f'"{REPO}/models/')
    path = tmp_dir / "models.config"
    path.write_text(text)
    return path


def wait_model_available(proc: Proc, rest_port: int, model: str = "fraud") -> None:
    """Wait until serving reports a version of `model` AVAILABLE (fails if it exits)."""
    url = f"http://127.0.0.1:{rest_port}/v1/models/{model}"

    def available() -> bool:
        assert proc.alive(), proc.log()
        try:
            return '"AVAILABLE"' in httpx.get(url, timeout=1.0).text
        except httpx.HTTPError:
            return False

    wait_until(available, 120, f"model {model} to be AVAILABLE")


@contextlib.contextmanager
def running_serving(tmp_dir: Path) -> Iterator[str]:
    """`python -m serving` on this checkout's models.config; yields its REST base URL."""
    rest_port = free_port()
    proc = start_serving(local_models_config(tmp_dir), rest_port, free_port(), tmp_dir / "serving.log")
    try:
        wait_model_available(proc, rest_port)
        yield f"http://127.0.0.1:{rest_port}"
    finally:
        proc.stop()
