"""`make run` as a user runs it in a terminal: Ctrl-C stops both tiers and make exits 0.

The terminal is a pseudo-terminal whose session leader is a shell running `make run`, as an
interactive shell's would be; Ctrl-C is the byte 0x03 typed into it, which the terminal
turns into SIGINT for its foreground process group (tools/foreground.py puts run-server.sh
there, not make). A supervisor's SIGTERM to run-server.sh stops it the same way. SIGTERM to
make's own pid, with a terminal and without one (CI), stops both tiers before make exits,
and make then ends by that signal (GNU make re-raises it on itself).
"""

from __future__ import annotations

import contextlib
import os
import pty
import select
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import pytest

from tests.support import REPO, free_port, process_running, wait_until

READY_S = 240.0


class Terminal:
    """`bash -c command` (`make run`) on a pseudo-terminal; `output` is everything it printed so far."""

    def __init__(self, env: dict[str, str], command: str = "make run") -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the session leader of the new terminal
            os.chdir(REPO)
            os.execvpe("bash", ["bash", "-c", command], env)
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
        API_OPS_BIND=f"127.0.0.1:{free_port()}",
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
    # Each tier runs in a session of its own (run-server.sh): its output still reaches the
    # terminal, and the API stopped (drained) before serving.
    assert text.index("Shutting down: Master") < text.rindex("Server stopped"), text[-3000:]
    assert not list(tmp_path.glob("serving-sockets.*"))  # run-server cleaned up after both tiers



def test_a_closed_terminal_whose_session_leader_is_make_stops_both_tiers(tmp_path: Path) -> None:
    """`ssh -t host make run`, `tmux new 'make run'`: make is the terminal's session leader
    (bash -c execs it), so a hang-up's SIGHUP reaches make alone, which waits for its recipe;
    tools/foreground.py sees the terminal hang up and stops run-server.sh."""
    env = make_run_env(tmp_path)
    ports = [int(env[name]) for name in ("API_PORT", "REST_API_PORT", "GRPC_PORT")]
    terminal = Terminal(env)
    tiers: dict[int, list[bytes]] = {}
    try:
        terminal.wait_for(b"run-server: API ready on", READY_S)
        tree = _descendants(terminal.pid)
        (run_server,) = [pid for pid, argv in tree.items() if argv[:2] == [b"bash", b"./run-server.sh"]]
        tiers = {**_descendants(run_server), run_server: tree[run_server]}
        os.close(terminal.fd)  # the terminal closes: the kernel hangs it up
        terminal.fd = -1
        deadline = time.monotonic() + 60
        while not os.waitpid(terminal.pid, os.WNOHANG)[0]:  # make ends once its recipe has
            assert time.monotonic() < deadline, "make still running 60 s after its terminal closed"
            time.sleep(0.2)
        deadline = time.monotonic() + 10
        while (left := _left(tiers, ports)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left, left
        assert not list(tmp_path.glob("serving-sockets.*"))  # run-server cleaned up after both tiers
    finally:
        _kill_all(terminal, tiers)


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


@pytest.mark.parametrize("tty", [True, False], ids=["terminal", "no-terminal"])
def test_sigterm_to_make_stops_both_tiers_first(tmp_path: Path, tty: bool) -> None:
    env = make_run_env(tmp_path)
    ports = [int(env[name]) for name in ("API_PORT", "REST_API_PORT", "GRPC_PORT")]
    ports.append(int(env["API_OPS_BIND"].rsplit(":", 1)[1]))
    tiers: dict[int, list[bytes]] = {}
    if tty:
        # The shell stays on, as an interactive one would: the terminal is not hung up when
        # make exits, so nothing but make's own SIGTERM handling can stop the tiers.
        terminal = Terminal(env, 'make run; echo "[make run exited: $?]"; exec sleep 300')
        run: Terminal | subprocess.Popen[bytes] = terminal
    else:
        make = subprocess.Popen(
            ["make", "run"], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        run = make
        output = _Output(make)
    try:
        if tty:
            terminal.wait_for(b"run-server: API ready on", READY_S)
            (make_pid,) = [pid for pid, argv in _descendants(terminal.pid).items() if argv[0] == b"make"]
        else:
            output.wait_for("run-server: API ready on", READY_S)
            make_pid = make.pid
        tree = _descendants(make_pid)
        (run_server,) = [pid for pid, argv in tree.items() if argv[:2] == [b"bash", b"./run-server.sh"]]
        tiers = _descendants(run_server)
        assert tiers, tree
        tiers[run_server] = tree[run_server]
        # The operational port's process detaches before it binds (api/operational/server.py),
        # so it is no descendant of run-server.sh and its port may open just after "API ready".
        wait_until(lambda: all(_accepts(port) for port in ports), 10, f"ports {ports} accepting")

        os.kill(make_pid, signal.SIGTERM)
        if tty:
            terminal.wait_for(b"[make run exited: ", 90)
            while not terminal.output.split(b"[make run exited: ", 1)[1].count(b"]"):
                terminal.read(0.5)
            text = terminal.output.decode(errors="replace")
            assert "[make run exited: 143]" in text, text[-4000:]  # 128 + SIGTERM
        else:
            assert make.wait(90) == -signal.SIGTERM, output.text[-4000:]
            text = output.text
        # make waited for the stop: no process of either tier outlives it (a bound for the
        # kernel to release a port or a worker's last exit), nor any of their ports.
        deadline = time.monotonic() + 10
        while (left := _left(tiers, ports)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left, (left, text[-4000:])
        assert "run-server: stopping" in text and "make: ***" not in text, text[-3000:]
        assert not list(tmp_path.glob("serving-sockets.*"))  # run-server cleaned up after both tiers
    finally:
        _kill_all(run, tiers)


class _Output:
    """Everything `process` prints on stdout, read by a thread as it comes."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        self._stdout = process.stdout
        self._chunks: list[bytes] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self._stdout:
            self._chunks.append(line)

    @property
    def text(self) -> str:
        return b"".join(self._chunks).decode(errors="replace")

    def wait_for(self, needle: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while needle not in self.text:
            if time.monotonic() > deadline:
                raise AssertionError(f"no {needle!r} in:\n{self.text[-4000:]}")
            time.sleep(0.2)


def _descendants(pid: int) -> dict[int, list[bytes]]:
    """Every live process under `pid`, with its command line (/proc/<pid>/task/*/children)."""
    found: dict[int, list[bytes]] = {}

    def walk(parent: int) -> None:
        with contextlib.suppress(FileNotFoundError):  # processes come and go
            for task in Path(f"/proc/{parent}/task").iterdir():
                for child in (task / "children").read_text().split():
                    with contextlib.suppress(FileNotFoundError):
                        found[int(child)] = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
                    walk(int(child))

    walk(pid)
    return found


def _left(pids: Iterable[int], ports: list[int]) -> list[str]:
    """Which of `pids` still run and which of `ports` still accept connections."""
    return [f"pid {pid}" for pid in sorted(pids) if process_running(pid)] + [f"port {p}" for p in ports if _accepts(p)]


def _accepts(port: int) -> bool:
    """True when 127.0.0.1:`port` accepts a TCP connection."""
    try:
        socket.create_connection(("127.0.0.1", port), 0.5).close()
    except OSError:
        return False
    return True


def _kill_all(run: Terminal | subprocess.Popen[bytes], tiers: dict[int, list[bytes]]) -> None:
    """SIGKILL what a failed run left behind: the terminal's session or make's, and the tiers."""
    leader = run.pid
    with contextlib.suppress(ProcessLookupError):
        os.killpg(leader, signal.SIGKILL)
    for pid, argv in tiers.items():  # run-server.sh's group, with a terminal; not a reused pid
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") == argv:
                os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(leader, 0)
    if isinstance(run, Terminal):
        with contextlib.suppress(OSError):
            os.close(run.fd)
