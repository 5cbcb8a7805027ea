"""Fixtures every test package may use: the model server on this checkout's example models;
SIGTERM ends the run through its teardowns."""

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


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
