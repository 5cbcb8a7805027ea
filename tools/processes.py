"""The project's processes on 127.0.0.1, for the tests and the benchmark: one way to start them.

- `serving_command`: the `python -m serving` command line from keyword flags, by TF Serving's
  flag names; `api_command` (the API as one uvicorn process), `gunicorn_command` (as
  deployed) and `run_server_command` (`run-server.sh`, both tiers in one container);
- `run_to_exit`: a command line run to its exit (a bad flag's one-line error);
- `Process`: a child process in its own session with its output in a log file: start, wait
  until ready (`wait_ready`, failing at once with the end of its log if it exits), stop
  (SIGTERM, then SIGKILL to its whole process group after a bound);
- `start_serving` / `Serving`: `python -m serving` on free loopback ports, with its models'
  state read from TF Serving's REST status API (`model_states`);
- `free_port`, `wait_until` (poll with a deadline, never a fixed sleep), `http_ok`.

Here rather than in `tests/` or `bench/`: both use it and neither should depend on the other
(the benchmark is not a test helper, and the tests check the benchmark). Developer-only, like
the rest of `tools/`: the images carry none of it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO

import httpx

__all__ = [
    "LOG_TAIL_CHARS",
    "REPO",
    "RUN_SERVER",
    "FlagValue",
    "NotReady",
    "Process",
    "Serving",
    "StartError",
    "api_command",
    "free_port",
    "gunicorn_command",
    "http_ok",
    "model_states",
    "run_server_command",
    "run_to_exit",
    "running_serving",
    "serving_command",
    "start_serving",
    "wait_until",
]

REPO = Path(__file__).resolve().parents[1]
RUN_SERVER = REPO / "run-server.sh"
#: How much of a process's log an error message quotes, characters.
LOG_TAIL_CHARS = 4000
#: A model server's REST status API answering before its models load takes TensorFlow's import
#: and the loads: seconds on an idle machine, a minute or more beside other work.
SERVING_READY_S = 120.0

FlagValue = str | int | float | bool | os.PathLike[str]
"""A flag's value: booleans are written `--name` (True) or `--name=false`."""


class StartError(Exception):
    """A process exited, or a condition did not hold in time, while it was waited for; the
    message ends with the end of the process's log."""


class NotReady(StartError, TimeoutError):
    """The condition waited for did not hold in time."""


# Ports `free_port` has handed out in this process. The kernel may give the port it has just
# freed to the next bind to port 0: two calls in a row once returned the same port, and a
# `make run` got REST_API_PORT = GRPC_PORT (serving refuses that). So a port is handed out once.
_HANDED_OUT: set[int] = set()
_FREE_PORT_TRIES = 64


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago and that this process was not given before.

    Raises:
        OSError: when `_FREE_PORT_TRIES` binds in a row gave only ports already handed out.
    """
    for _ in range(_FREE_PORT_TRIES):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise OSError(f"no new free port on 127.0.0.1 in {_FREE_PORT_TRIES} tries")


def wait_until(
    predicate: Callable[[], bool],
    timeout_s: float,
    what: str,
    *,
    watch: Sequence[Process] = (),
    poll_s: float = 0.05,
) -> None:
    """Poll `predicate` every `poll_s` seconds until it is true.

    Raises:
        StartError: as soon as a watched process has exited (with the end of its log).
        NotReady: after `timeout_s` seconds (with the end of each watched process's log).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return
        for proc in watch:
            if not proc.alive():
                raise StartError(f"{proc.name} exited ({proc.returncode}) while waiting for {what}:\n{proc.log()}")
        if time.monotonic() >= deadline:
            logs = "".join(f"\n--- {p.name}:\n{p.log(LOG_TAIL_CHARS // 2)}" for p in watch)
            raise NotReady(f"timed out after {timeout_s:g}s waiting for {what}{logs}")
        time.sleep(poll_s)


def http_ok(url: str, timeout_s: float = 1.0) -> bool:
    """True when GET `url` answers 2xx within `timeout_s`."""
    try:
        return httpx.get(url, timeout=timeout_s).is_success
    except httpx.HTTPError:
        return False


# --- command lines -------------------------------------------------------------------------------


def _flag(name: str, value: FlagValue) -> str:
    if value is True:
        return f"--{name}"
    if value is False:
        return f"--{name}=false"
    return f"--{name}={os.fspath(value) if isinstance(value, os.PathLike) else value}"


def serving_command(*, python: str = sys.executable, extra: Sequence[str] = (), **flags: FlagValue) -> list[str]:
    """`python -m serving` with `flags`, named as TF Serving's (`tensorflow_model_server
    --help`, `serving.model_servers.flags`): `serving_command(port=8500, enable_batching=True)`
    is `[python, "-m", "serving", "--port=8500", "--enable_batching"]`. `extra`: flags already
    written (`--name=value`), e.g. given on a command line, put last."""
    return _serving_argv(flags, extra, python)


def _serving_argv(flags: Mapping[str, FlagValue], extra: Sequence[str], python: str = sys.executable) -> list[str]:
    return [python, "-m", "serving", *(_flag(name, value) for name, value in flags.items()), *extra]


def api_command(port: int, *, host: str = "127.0.0.1", python: str = sys.executable) -> list[str]:
    """The API as one uvicorn process (`api.app:create_app`), warnings only in its log."""
    return [
        python, "-m", "uvicorn", "--factory", "api.app:create_app",
        f"--host={host}", f"--port={port}", "--log-level=warning",
    ]  # fmt: skip


def gunicorn_command(*options: str, config: str = "gunicorn.conf.py", app: str = "api.app:create_app()") -> list[str]:
    """The API under gunicorn as deployed (`gunicorn -c gunicorn.conf.py 'api.app:create_app()'`;
    bind it with `API_BIND`), with gunicorn's `options` before the app."""
    return [sys.executable, "-m", "gunicorn", "-c", config, *options, app]


def run_server_command() -> list[str]:
    """`run-server.sh`: serving and the API under gunicorn, supervised together (its settings
    are environment variables)."""
    return ["bash", str(RUN_SERVER)]


# --- processes -----------------------------------------------------------------------------------


def run_to_exit(
    args: Sequence[str], *, timeout_s: float = 60.0, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `args` in the repository root until it exits (at most `timeout_s`), its output
    captured as text: a command line expected to fail fast (a bad flag) or to finish."""
    return subprocess.run(
        list(args),
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


class Process:
    """A child process in its own session (process group), its output in `log_path`.

    Started in the repository root with `env` added to this environment. Its own session lets
    `stop` end everything it started (gunicorn's workers, run-server.sh's children) when it
    does not exit on SIGTERM. Usable as a context manager (stopped on exit).
    """

    def __init__(
        self,
        args: Sequence[str],
        log_path: Path,
        *,
        name: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: Path = REPO,
    ) -> None:
        self.args = list(args)
        self.name = name or log_path.stem
        self.log_path = log_path
        self._log: IO[bytes] = open(log_path, "wb")  # noqa: SIM115 - closed by stop()
        self.popen = subprocess.Popen(
            self.args,
            cwd=cwd,
            env={**os.environ, **(env or {})},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        """The process id (the root of its tree, and its process group's id)."""
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        """The exit code once it has exited (negative: the signal that ended it), else None."""
        return self.popen.poll()

    def alive(self) -> bool:
        """True while the process has not exited."""
        return self.popen.poll() is None

    def log(self, tail_chars: int | None = LOG_TAIL_CHARS) -> str:
        """Its output so far: the last `tail_chars` characters, or all of it (None)."""
        if not self._log.closed:
            self._log.flush()
        text = self.log_path.read_text(errors="replace")
        return text if tail_chars is None else text[-tail_chars:]

    def wait_ready(self, predicate: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.05) -> None:
        """`wait_until(predicate)`, failing at once (with its log) if this process exits."""
        wait_until(predicate, timeout_s, f"{self.name}: {what}", watch=[self], poll_s=poll_s)

    def wait_for_log(self, needle: str, timeout_s: float) -> None:
        """Wait until `needle` appears in its output."""
        self.wait_ready(lambda: needle in self.log(None), timeout_s, f"{needle!r} in its log")

    def send_signal(self, signum: int) -> None:
        """Send `signum` to the process itself (not its group)."""
        self.popen.send_signal(signum)

    def wait(self, timeout_s: float) -> int:
        """Wait for it to exit; its exit code. Raises `subprocess.TimeoutExpired`."""
        return self.popen.wait(timeout_s)

    def stop(self, timeout_s: float = 20.0) -> int:
        """SIGTERM, wait up to `timeout_s`, then SIGKILL its process group. Returns the exit code."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close_log()
        return self.popen.wait()

    def kill(self) -> int:
        """SIGKILL its process group now and wait. Returns the exit code."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        code = self.popen.wait(10.0)
        self._close_log()
        return code

    def _close_log(self) -> None:
        if not self._log.closed:
            self._log.close()

    def __enter__(self) -> Process:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


# --- the model server ----------------------------------------------------------------------------


def model_states(rest_url: str, model: str, timeout_s: float = 2.0) -> dict[int, str]:
    """Version -> state (`AVAILABLE`, `END`, ...) of `model` from TF Serving's REST status API
    (`GET /v1/models/{model}`); {} while the server does not answer or knows no such model."""
    try:
        response = httpx.get(f"{rest_url}/v1/models/{model}", timeout=timeout_s)
        if response.status_code != 200:
            return {}
        return {int(v["version"]): v["state"] for v in response.json()["model_version_status"]}
    except (httpx.HTTPError, ValueError, KeyError):
        return {}


@dataclass
class Serving:
    """A running `python -m serving` (`start_serving`): its process and its ports on 127.0.0.1
    (`rest_port` 0: no REST)."""

    process: Process
    rest_port: int
    grpc_port: int

    @property
    def rest_url(self) -> str:
        """`http://127.0.0.1:<rest_port>`."""
        return f"http://127.0.0.1:{self.rest_port}"

    @property
    def grpc_target(self) -> str:
        """`127.0.0.1:<grpc_port>`."""
        return f"127.0.0.1:{self.grpc_port}"

    def log(self, tail_chars: int | None = LOG_TAIL_CHARS) -> str:
        """Its output so far (`Process.log`)."""
        return self.process.log(tail_chars)

    def states(self, model: str) -> dict[int, str]:
        """`model_states` of `model` now."""
        return model_states(self.rest_url, model)

    def wait_for_states(self, model: str, expected: Mapping[int, str], timeout_s: float = SERVING_READY_S) -> None:
        """Wait until each version in `expected` of `model` is in its state."""
        self.process.wait_ready(
            lambda: all(self.states(model).get(v) == s for v, s in expected.items()),
            timeout_s,
            f"model {model} {dict(expected)}",
            poll_s=0.1,
        )

    def wait_available(self, *models: str, timeout_s: float = SERVING_READY_S) -> None:
        """Wait until some version of each of `models` is AVAILABLE."""
        for model in models:
            self.wait_for(model, "AVAILABLE", timeout_s)

    def wait_for(self, model: str, state: str, timeout_s: float = SERVING_READY_S) -> None:
        """Wait until some version of `model` is in `state` (`END`: a version that failed)."""
        self.process.wait_ready(
            lambda: state in self.states(model).values(), timeout_s, f"model {model} {state}", poll_s=0.1
        )

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM, then SIGKILL after `timeout_s` (`Process.stop`). Returns the exit code."""
        return self.process.stop(timeout_s)


def start_serving(
    log_path: Path,
    *,
    env: Mapping[str, str] | None = None,
    prefix: Sequence[str] = (),
    extra: Sequence[str] = (),
    **flags: FlagValue,
) -> Serving:
    """Start `python -m serving` with `flags` (`serving_command`) on 127.0.0.1, without
    waiting (`Serving.wait_available`, `Serving.wait_for_states`).

    `port` and `rest_api_port` are free ports unless given (`rest_api_port=0`: no REST, as in
    TF Serving); both listen on 127.0.0.1 unless `grpc_host` / `rest_api_host` say otherwise.
    `prefix` goes before the command (e.g. `taskset -c 0`).
    """
    return _start_serving(log_path, flags, env=env, prefix=prefix, extra=extra)


def _start_serving(
    log_path: Path,
    flags: Mapping[str, FlagValue],
    *,
    env: Mapping[str, str] | None = None,
    prefix: Sequence[str] = (),
    extra: Sequence[str] = (),
) -> Serving:
    grpc_port, rest_port = _port(flags, "port"), _port(flags, "rest_api_port")
    ports: dict[str, FlagValue] = {"port": grpc_port, "grpc_host": "127.0.0.1"}
    ports |= {"rest_api_port": rest_port, "rest_api_host": "127.0.0.1"}
    command = [*prefix, *_serving_argv({**ports, **flags}, extra)]
    return Serving(Process(command, log_path, env=env), rest_port, grpc_port)


def _port(flags: Mapping[str, FlagValue], name: str) -> int:
    """The port flag `name` as given, else a free port."""
    value = flags.get(name)
    if value is None:
        return free_port()
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"--{name} must be an int, got {value!r}")
    return value


@contextlib.contextmanager
def running_serving(log_path: Path, *models: str, **flags: FlagValue) -> Iterator[Serving]:
    """`start_serving(log_path, **flags)`, waited for until each of `models` is AVAILABLE, and
    stopped afterwards."""
    serving = _start_serving(log_path, flags)
    try:
        serving.wait_available(*models)
        yield serving
    finally:
        serving.stop()
