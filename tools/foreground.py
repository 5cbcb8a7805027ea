"""Run a command as the terminal's foreground process group, so Ctrl-C stops it and not make.

    python -m tools.foreground ./run-server.sh        # what `make run` runs

Ctrl-C sends SIGINT to the terminal's foreground process group: every process `make run`
started, and make itself. run-server.sh stops both tiers and exits 0, but GNU make, on
SIGINT, waits for its recipe and then ends itself by the signal ("make: *** [Makefile:N: run]
Interrupt", status 130). Here the command runs in a process group of its own that the
terminal puts in the foreground: Ctrl-C reaches the command and not make, which then exits
with the command's status, 0 after a clean stop. SIGTERM and SIGHUP sent to this process
are passed on to the command's group. Without a terminal (CI, a pipe, a container) there is
nothing to hand over and the command simply replaces this process.

A SIGTERM sent to make itself still ends make by that signal once its recipe is done: GNU
make passes it to the recipe (run-server.sh stops cleanly) and then re-raises it on itself.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType


def main(argv: list[str]) -> int:
    """Run `argv` in the foreground; its exit status (128 + N for a signal N)."""
    if not argv:
        print("usage: python -m tools.foreground COMMAND [ARG...]", file=sys.stderr)
        return 2
    try:
        terminal = os.open("/dev/tty", os.O_RDWR)
    except OSError:  # no controlling terminal: nothing to hand over
        os.execvp(argv[0], argv)
    ready_read, ready_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ready_write)
        os.setpgid(0, 0)
        os.read(ready_read, 1)  # until the terminal is ours: a background group may not read it
        os.close(ready_read)
        os.execvp(argv[0], argv)
    os.close(ready_read)
    try:
        os.setpgid(pid, pid)  # also here, so tcsetpgrp cannot run before the child's own call
    except PermissionError:
        pass  # it already did
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # a background process may not hand the terminal over
    own_group = os.getpgrp()
    os.tcsetpgrp(terminal, pid)

    def forward(signum: int, frame: FrameType | None) -> None:
        os.killpg(pid, signum)

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, forward)
    os.close(ready_write)
    _, status = os.waitpid(pid, 0)
    try:
        os.tcsetpgrp(terminal, own_group)
    except OSError:
        pass  # the terminal or our group is gone (make ended first): nothing to give back
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
