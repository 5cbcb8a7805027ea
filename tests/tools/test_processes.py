"""`tools.processes`: the command lines, and a process's start, wait and stop."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

from tools.processes import (
    NotReady,
    Process,
    StartError,
    free_port,
    model_states,
    serving_command,
    wait_until,
)


def test_the_serving_command_names_tf_servings_flags() -> None:
    command = serving_command(
        port=8500, model_config_file=Path("/m/models.config"), enable_batching=True,
        allow_version_labels_for_unavailable_models=False, extra=["--rest_api_num_threads=2"],
    )  # fmt: skip
    assert command == [
        sys.executable, "-m", "serving", "--port=8500", "--model_config_file=/m/models.config",
        "--enable_batching", "--allow_version_labels_for_unavailable_models=false", "--rest_api_num_threads=2",
    ]  # fmt: skip


def test_an_exit_while_waited_for_fails_at_once_with_the_end_of_the_log(tmp_path: Path) -> None:
    proc = Process([sys.executable, "-c", "print('bad flag'); raise SystemExit(2)"], tmp_path / "quick.log")
    started = time.monotonic()
    with pytest.raises(StartError, match=r"quick exited \(2\) while waiting for quick: never:\nbad flag"):
        proc.wait_ready(lambda: False, 30, "never")
    assert time.monotonic() - started < 10
    assert proc.stop() == 2


def test_a_condition_that_never_holds_times_out_as_a_timeout_error() -> None:
    with pytest.raises(TimeoutError, match="timed out after 0.2s waiting for nothing"):
        wait_until(lambda: False, 0.2, "nothing")
    assert issubclass(NotReady, StartError)


def test_stop_kills_the_whole_group_when_sigterm_is_ignored(tmp_path: Path) -> None:
    # A parent that ignores SIGTERM and has started a child that does too (a stuck worker).
    script = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "child = subprocess.Popen([sys.executable, '-c', "
        "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(\"child\", flush=True); "
        "time.sleep(60)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = Process([sys.executable, "-c", script], tmp_path / "stuck.log")
    proc.wait_for_log("child", 30)
    child = int(proc.log().split()[0])
    started = time.monotonic()
    assert proc.stop(timeout_s=0.5) == -signal.SIGKILL
    assert time.monotonic() - started < 10
    wait_until(lambda: not Path(f"/proc/{child}").exists() or _zombie(child), 10, "the child to be killed too")


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_model_states_are_empty_while_nothing_answers() -> None:
    assert model_states(f"http://127.0.0.1:{free_port()}", "fraud", timeout_s=0.5) == {}


class _KernelThatReusesPorts:
    """Stands in for `socket.socket`: bind to port 0 gets the ports of `given`, in order."""

    def __init__(self, given: list[int]) -> None:
        self.given = given

    def __call__(self) -> _KernelThatReusesPorts:
        return self

    def __enter__(self) -> _KernelThatReusesPorts:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def bind(self, address: tuple[str, int]) -> None:
        self.port = self.given.pop(0)

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)


def test_free_port_never_hands_out_a_port_twice_though_the_kernel_gives_it_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the kernel may give the port it has just freed to the next bind: REST_API_PORT and
    # GRPC_PORT once came out the same and serving refused to start
    monkeypatch.setattr("tools.processes._HANDED_OUT", set())
    monkeypatch.setattr("tools.processes.socket.socket", _KernelThatReusesPorts([41001, 41001, 41001, 41002]))
    assert [free_port(), free_port()] == [41001, 41002]


def test_free_port_gives_up_when_the_kernel_has_nothing_new(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tools.processes._HANDED_OUT", {41001})
    monkeypatch.setattr("tools.processes.socket.socket", _KernelThatReusesPorts([41001] * 64))
    with pytest.raises(OSError, match="no new free port"):
        free_port()
