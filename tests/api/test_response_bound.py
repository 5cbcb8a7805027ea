"""The bound on serving's answers: a replica that announces or streams a huge body.

Before it, the HTTP/1.1 client appended every chunk: a replica announcing 200 MB took a
worker to 878 MB with 3 requests. Now the exchange fails at once (`ResponseTooLarge`), the
connection is dropped, and the API answers 502 `serving_bad_response`; the worker's memory
stays where it was. The bound comes from the routes' outputs (`api.inference.response_bound`).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from api.inference.response_bound import OVERHEAD_BYTES, predict_response_bound
from api.model_routes import Signature, TensorSpec
from api.serving_client import DataType
from api.serving_client._http1 import ConnectionPool, ResponseTooLarge
from tests.api.stack import start_api_process, start_fake, transactions


async def _huge_server(announced: int, sent: list[int]) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % announced)
        try:
            chunk = b"0" * (1 << 20)
            while sent[0] < announced:
                writer.write(chunk)
                sent[0] += len(chunk)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def test_an_announced_body_over_the_bound_fails_at_once_and_drops_the_connection() -> None:
    async def run() -> None:
        sent = [0]
        server = await _huge_server(200 << 20, sent)
        port = server.sockets[0].getsockname()[1]
        pool = ConnectionPool(f"http://127.0.0.1:{port}", max_connections=2, keepalive_expiry_s=5)
        started = time.monotonic()
        with pytest.raises(ResponseTooLarge):
            await pool.request("GET", "/", timeout=5, connect_timeout=1, max_response_bytes=1 << 20)
        assert time.monotonic() - started < 2
        assert pool.connections == 0  # dropped, not kept
        await pool.aclose()
        server.close()

    asyncio.run(run())


def test_a_streamed_body_over_the_bound_is_cut_as_it_grows() -> None:
    async def run() -> None:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            try:
                for _ in range(200):
                    writer.write(b"100000\r\n" + b"0" * 0x100000 + b"\r\n")
                    await writer.drain()
            except (ConnectionError, OSError):
                pass
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        pool = ConnectionPool(f"http://127.0.0.1:{port}", max_connections=2, keepalive_expiry_s=5)
        with pytest.raises(ResponseTooLarge):
            await pool.request("GET", "/", timeout=5, connect_timeout=1, max_response_bytes=4 << 20)
        await pool.aclose()
        server.close()

    asyncio.run(run())


def test_the_bound_follows_the_routes_outputs() -> None:
    score = Signature("fraud", inputs={"x": TensorSpec(shape=(11,))}, outputs={"y": TensorSpec(shape=(1,))})
    digits = Signature("digits", inputs={"x": TensorSpec(shape=(64,))}, outputs={"p": TensorSpec(shape=(10,))})
    assert predict_response_bound([score, digits], rows=64) == 10 * 64 * 32 + OVERHEAD_BYTES
    text = Signature("t", inputs={"x": TensorSpec(shape=(1,))}, outputs={"s": TensorSpec(DataType.DT_STRING)})
    assert predict_response_bound([score, text], rows=64) is None


def test_the_api_answers_502_at_once_when_a_replica_sends_a_huge_body(tmp_path: Path) -> None:
    fake = start_fake(tmp_path, "serving")
    api = start_api_process(tmp_path, "api", fake.url)
    try:
        body = transactions(1)[0]
        assert httpx.post(api.url + "/v1/fraud/score", json=body, timeout=10).status_code == 200
        httpx.post(fake.url + "/_fake/huge", params={"bytes": str(200 << 20)}, timeout=5).raise_for_status()
        for _ in range(3):
            started = time.monotonic()
            answer = httpx.post(api.url + "/v1/fraud/score", json=body, timeout=10)
            assert answer.status_code == 502, answer.text
            assert answer.json()["code"] == "serving_bad_response"
            assert time.monotonic() - started < 1.5
        httpx.post(fake.url + "/_fake/huge", params={"bytes": "0"}, timeout=5).raise_for_status()
        assert httpx.post(api.url + "/v1/fraud/score", json=body, timeout=10).status_code == 200
    finally:
        api.proc.stop()
        fake.proc.stop()
