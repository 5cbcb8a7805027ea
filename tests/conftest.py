"""Fixtures every test package may use: the model server on this checkout's example models."""

from __future__ import annotations

from collections.abc import Iterator

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
