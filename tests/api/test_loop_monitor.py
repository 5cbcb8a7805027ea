"""Event-loop block detector: a blocking `async def` route is named and counted.

The app is the real one (`create_app`) built here with extra test-only routes; serving
is never called. Assertions only use lower bounds on time (a 300 ms block is late by
more than the 50 ms threshold), never upper bounds, so a slow machine cannot fail them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from api.app import create_app
from api.config.settings import Settings
from api.observability.loop_monitor import LoopMonitor
from api.observability.metrics import ApiMetrics
from tests.support import EXAMPLE_ROUTES

BLOCKING_ROUTE = "/test/blocking/{n}"
NON_BLOCKING_ROUTE = "/test/awaiting"


def build_app(tmp_path: Path) -> FastAPI:
    settings = Settings(
        model_routes=EXAMPLE_ROUTES.split(","),
        serving_url="http://127.0.0.1:9",
        events_jsonl_path=tmp_path / "events.jsonl",
        loop_monitor_interval_s=0.02,
        loop_block_threshold_s=0.05,
    )
    app = create_app(settings)

    @app.get(BLOCKING_ROUTE)
    async def blocking(n: int) -> dict[str, int]:
        time.sleep(0.3)  # the bug under test: a sync sleep inside async def
        return {"n": n}

    @app.get(NON_BLOCKING_ROUTE)
    async def awaiting() -> dict[str, bool]:
        await asyncio.sleep(0.3)
        return {"ok": True}

    return app


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(build_app(tmp_path)) as c:
        yield c


def families(text: str) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    return {
        f.name: [(s.name, s.labels, s.value) for s in f.samples]
        for f in text_string_to_metric_families(text)
    }


def blocks(client: TestClient) -> dict[str, float]:
    """api_event_loop_blocks_total by route."""
    fams = families(client.get("/metrics").text)
    return {
        labels["route"]: value
        for name, labels, value in fams["api_event_loop_blocks"]
        if name.endswith("_total")
    }


def loop_monitor_warnings(err: str) -> list[dict[str, object]]:
    records = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    return [r for r in records if r["logger"] == "api.observability.loop_monitor" and r["level"] == "WARNING"]


def test_blocking_route_is_logged_by_name_and_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with TestClient(build_app(tmp_path)) as client:  # built here so it logs to capsys
        assert client.get("/test/blocking/1").status_code == 200
        assert blocks(client)[BLOCKING_ROUTE] == 1
    warnings = [
        w for w in loop_monitor_warnings(capsys.readouterr().err) if w["route"] == BLOCKING_ROUTE
    ]
    assert len(warnings) == 1
    warning = warnings[0]
    assert f"by route {BLOCKING_ROUTE}" in str(warning["msg"])
    assert float(warning["blocked_ms"]) > 50  # type: ignore[arg-type]
    # The innermost frame of the loop thread is the sleeping line of this file.
    assert str(warning["where"]).startswith(__file__)
    assert str(warning["where"]).endswith("in blocking")


def test_each_block_counted_once(client: TestClient) -> None:
    for n in range(3):
        assert client.get(f"/test/blocking/{n}").status_code == 200
    assert blocks(client)[BLOCKING_ROUTE] == 3


def test_awaiting_route_is_not_blamed(client: TestClient) -> None:
    assert client.get(NON_BLOCKING_ROUTE).status_code == 200
    assert blocks(client).get(NON_BLOCKING_ROUTE, 0.0) == 0


def test_lag_histogram_sees_the_block(client: TestClient) -> None:
    assert client.get("/test/blocking/9").status_code == 200
    fams = families(client.get("/metrics").text)
    lag = {
        name: value
        for name, labels, value in fams["api_event_loop_lag_seconds"]
        if name.endswith(("_sum", "_count"))
    }
    assert lag["api_event_loop_lag_seconds_count"] >= 1
    # The probe woke at least ~0.25 s late once: 0.3 s of sleep minus one interval.
    assert lag["api_event_loop_lag_seconds_sum"] >= 0.2


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_block_outside_any_request_is_unknown() -> None:
    metrics = ApiMetrics()
    monitor = LoopMonitor(metrics, interval_s=0.02, threshold_s=0.05)
    await monitor.start()
    try:
        await asyncio.sleep(0.05)
        time.sleep(0.3)  # not in a tracked request task
        await asyncio.sleep(0.05)  # let the probe run once more
    finally:
        await monitor.stop()
    text = metrics.exposition()[0].decode()
    counted = {
        labels["route"]: value
        for name, labels, value in families(text)["api_event_loop_blocks"]
        if name.endswith("_total")
    }
    # At least the deliberate block (a stalled test machine may add more), and nothing
    # blamed on a route.
    assert set(counted) == {"unknown"}
    assert counted["unknown"] >= 1


@pytest.mark.anyio
async def test_a_long_queue_of_short_callbacks_is_overload_not_a_block(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = ApiMetrics()
    monitor = LoopMonitor(metrics, interval_s=0.02, threshold_s=0.05)
    await monitor.start()
    caplog.set_level(logging.INFO, logger="api.observability.loop_monitor")
    try:
        await asyncio.sleep(0.05)
        loop = asyncio.get_running_loop()

        def short_step() -> None:
            time.sleep(0.002)  # each callback is short; together they hold the loop 0.4 s

        for _ in range(200):
            loop.call_soon(short_step)
        await asyncio.sleep(0)  # the queue runs here, before the probe's wake-up
        await asyncio.sleep(0.05)
    finally:
        await monitor.stop()
    text = metrics.exposition()[0].decode()
    counted = sum(
        value
        for name, labels, value in families(text)["api_event_loop_blocks"]
        if name.endswith("_total")
    )
    overload = [r for r in caplog.records if "overload, not a block" in r.getMessage()]
    assert overload, [r.getMessage() for r in caplog.records]
    assert counted == 0


def test_monitor_rejects_bad_settings() -> None:
    with pytest.raises(ValueError):
        LoopMonitor(ApiMetrics(), interval_s=0, threshold_s=0.1)
