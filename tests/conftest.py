"""Fixtures every test package may use: the model server on this checkout's example models;
SIGTERM ends the run through its teardowns; the processes tests start get the default
handling of SIGINT and SIGHUP even when the run was started with them ignored."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from types import FrameType

import pytest

from tests.support import Serving, start_example_serving


@pytest.fixture(scope="module")
def example_serving(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serving]:
    """`python -m serving` on this checkout's models.config (fraud, digits) on free loopback
    ports, once the fraud model is AVAILABLE; one per test module, stopped after it."""
    serving = start_example_serving(tmp_path_factory.mktemp("example-serving"))
    try:
        serving.wait_available("fraud")
        yield serving
    finally:
        serving.stop()


def pytest_configure(config: pytest.Config) -> None:
    """SIGTERM to pytest (a CI runner's stop, `kill`) unwinds like Ctrl-C does.

    Python's default for SIGTERM ends the process at once, so no fixture's teardown ran and
    every server a test had started (model servers, fake replicas on 127.0.0.2-4) was left
    running under PID 1. As KeyboardInterrupt, pytest runs the teardowns and then stops.
    """
    signal.signal(signal.SIGTERM, _interrupt)
    _children_get_default_handling(signal.SIGINT, signal.SIGHUP)


def _children_get_default_handling(*signums: signal.Signals) -> None:
    """Give the processes tests start the default handling of `signums` where this run ignores them.

    A run started in the background by a shell without job control (`make test &`) ignores
    SIGINT, one under `nohup` SIGHUP, and an ignored signal stays ignored across exec: every
    `make run` and run-server.sh the tests started then ignored the Ctrl-C and the closed
    terminal the tests send them (bash cannot trap a signal ignored at its start), and those
    tests failed. A handler of our own is reset to the default at exec, so this run keeps
    ignoring them (the handler does nothing) while its children do not.
    """
    for signum in signums:
        if signal.getsignal(signum) is signal.SIG_IGN:
            signal.signal(signum, _ignore)


def _ignore(signum: int, frame: FrameType | None) -> None:
    """Ignore the signal here; unlike SIG_IGN, not inherited by the processes started."""


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
