"""The closed-connections summary: at most one line per interval, and none left waiting for a later closure."""

from __future__ import annotations

import asyncio
import logging

import pytest

from api.http_server import connections
from api.http_server.connections import ConnectionRegistry

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_closures_after_a_summary_are_logged_when_the_interval_ends(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(connections, "LOG_INTERVAL_S", 0.2)
    registry = ConnectionRegistry(max_connections=4)
    with caplog.at_level(logging.WARNING, logger="api.http_server"):
        registry.closed("header_timeout")  # first: logged at once
        registry.closed("too_large_head")  # within the interval: held
        registry.closed("too_large_head")
        assert [r.__dict__["closed"] for r in caplog.records] == [{"header_timeout": 1}]
        await asyncio.sleep(0.4)  # no further closure arrives
    assert [r.__dict__["closed"] for r in caplog.records] == [
        {"header_timeout": 1},
        {"too_large_head": 2},
    ]
