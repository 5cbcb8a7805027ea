"""`make run` as a user runs it in a terminal: Ctrl-C stops both tiers and make exits 0.

The terminal is a pseudo-terminal whose session leader is a shell running `make run`, as an
interactive shell's would be; Ctrl-C is the byte 0x03 typed into it, which the terminal
turns into SIGINT for its foreground process group (tools/foreground.py puts run-server.sh
there, not make). A supervisor's SIGTERM to run-server.sh stops it the same way.
"""

from __future__ import annotations

import os
import pty
import select
import signal
import time
from pathlib import Path

import pytest

from tests.support import REPO, free_port, wait_until

READY_S = 240.0


class Terminal:
    """`bash -c 'make run'` on a pseudo-terminal; `output` is everything it printed so far."""

    def __init__(self, env: dict[str, str]) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the session leader of the new terminal
            os.chdir(REPO)
            os.execvpe("bash", ["bash", "-c", "make run"], env)
        self.output = b""

    def read(self, timeout_s: float) -> bool:
        """Read what is there within `timeout_s`; False once the terminal is closed."""
        ready, _, _ = select.select([self.fd], [], [], timeout_s)
        if not ready:
            return True
        try:
            data = os.read(self.fd, 65536)
        except OSError:  # EIO: every process of the terminal has exited
            return False
        self.output += data
        return bool(data)

    def wait_for(self, needle: bytes, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while needle not in self.output:
            if time.monotonic() > deadline or not self.read(0.5):
                raise AssertionError(f"no {needle!r} in:\n{self.output.decode(errors='replace')[-4000:]}")

    def exit_code(self, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.read(0.2)
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                while self.read(0.1):
                    pass
                os.close(self.fd)
                return os.waitstatus_to_exitcode(status)
        os.killpg(self.pid, signal.SIGKILL)
        raise AssertionError(f"make run still running:\n{self.output.decode(errors='replace')[-4000:]}")


def make_run_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))}
    env.update(
        API_PORT=str(free_port()), REST_API_PORT=str(free_port()), GRPC_PORT=str(free_port()),
        API_HOST="127.0.0.1", WEB_CONCURRENCY="1", TMPDIR=str(tmp_path), TERM="dumb",
    )  # fmt: skip
    return env


@pytest.mark.parametrize("stop", ["ctrl-c", "sigterm-to-run-server"])
def test_make_run_stopped_exits_0(tmp_path: Path, stop: str) -> None:
    terminal = Terminal(make_run_env(tmp_path))
    terminal.wait_for(b"run-server: API ready on", READY_S)
    if stop == "ctrl-c":
        os.write(terminal.fd, b"\x03")
    else:
        (run_server,) = _descendant(terminal.pid)
        os.kill(run_server, signal.SIGTERM)
    code = terminal.exit_code(90)
    text = terminal.output.decode(errors="replace")
    assert code == 0, text[-4000:]
    assert "run-server: stopping" in text and "make: ***" not in text, text[-3000:]
    assert not list(tmp_path.glob("serving-sockets.*"))  # run-server cleaned up after both tiers


def _descendant(pid: int) -> set[int]:
    """The run-server.sh process under `pid` (bash -> make -> python -m tools.foreground -> bash run-server.sh)."""
    found: set[int] = set()

    def walk(parent: int) -> None:
        for task in Path(f"/proc/{parent}/task").iterdir():
            for child in (task / "children").read_text().split():
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
                if cmdline[:2] == [b"bash", b"./run-server.sh"]:  # the script, not make's sh -c line
                    found.add(int(child))
                else:
                    walk(int(child))

    wait_until(lambda: (walk(pid), bool(found))[1], 10, "run-server.sh under make")
    return found
