"""Run a command as the terminal's foreground process group, so Ctrl-C stops it and not make.

    python -m tools.foreground ./run-server.sh        # what `make run` runs

Ctrl-C sends SIGINT to the terminal's foreground process group: every process `make run`
started, and make itself. run-server.sh stops both tiers and exits 0, but GNU make, on
SIGINT, waits for its recipe and then ends itself by the signal ("make: *** [Makefile:N: run]
Interrupt", status 130). Here the command runs in a process group of its own that the
terminal puts in the foreground: Ctrl-C reaches the command and not make, which then exits
with the command's status, 0 after a clean stop. Without a terminal (CI, a pipe, a container)
there is nothing to hand over and the command simply replaces this process.

SIGTERM, SIGHUP and SIGINT sent to this process are passed on to the command's process (not
its group: run-server.sh stops the API first, which drains in-flight requests, then serving;
the group would hear it all at once) and this process waits for the command to exit.

A terminal that closes (its window, an ssh connection) hangs up: the kernel sends SIGHUP
to the session leader alone, and every process of the session loses the terminal. When
the session leader is make itself (`ssh -t host make run`, `tmux new 'make run'`), make
catches the SIGHUP and waits for its recipe, which never hears it: both tiers were left
running on their ports. So this process also watches the terminal it opened: once it is
hung up (poll says POLLHUP), the command gets SIGHUP as if this process had.

SIGTERM sent to make itself: GNU make sends SIGTERM to its recipe's process alone, waits
for it, and then ends itself by the same signal (status 143 in a shell, "Terminated"; it
cannot be 0). The Makefile's recipe `exec`s, so that process is this one (or, without a
terminal, run-server.sh): both tiers are stopped before make exits. Without the exec it was
/bin/sh -c, which died of the signal and left this process, run-server.sh and both tiers
running, outside make's reach.
"""

from __future__ import annotations

import os
import select
import signal
import sys
from types import FrameType

#: Passed on to the command; blocked from before the fork until the handler is in place, so
#: one arriving meanwhile is forwarded too instead of ending this process alone.
FORWARDED = {signal.SIGTERM, signal.SIGHUP, signal.SIGINT}


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
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    pid = os.fork()
    if pid == 0:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)  # a blocked mask survives exec
        os.close(ready_write)
        os.setpgid(0, 0)
        os.read(ready_read, 1)  # until the terminal is ours: a background group may not read it
        os.close(ready_read)
        os.execvp(argv[0], argv)

    def forward(signum: int, frame: FrameType | None) -> None:
        os.kill(pid, signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    os.close(ready_read)
    try:
        os.setpgid(pid, pid)  # also here, so tcsetpgrp cannot run before the child's own call
    except PermissionError:
        pass  # it already did
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # a background process may not hand the terminal over
    own_group = os.getpgrp()
    os.tcsetpgrp(terminal, pid)
    os.close(ready_write)
    status = _wait_hanging_up(pid, terminal)
    for signum in FORWARDED:  # its pid may be reused now
        signal.signal(signum, signal.SIG_IGN)
    try:
        os.tcsetpgrp(terminal, own_group)
    except OSError:
        pass  # the terminal or our group is gone (make ended first): nothing to give back
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


#: How often the wait for the command looks at the terminal, seconds.
HANGUP_POLL_S = 0.5


def _wait_hanging_up(pid: int, terminal: int) -> int:
    """Wait for `pid` to exit and return its wait status; send it SIGHUP, once, when
    `terminal` hangs up meanwhile (see the module doc)."""
    watch = select.poll()
    watch.register(terminal, 0)  # no events asked: poll reports only POLLHUP / POLLERR
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if watch.poll(HANGUP_POLL_S * 1000):
            os.kill(pid, signal.SIGHUP)
            return os.waitpid(pid, 0)[1]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
