"""Hostile clients for the chaos run, in their own process so they do not slow the load's.

    python -m tests.chaos.attacks idle  --port 8000 --count 2500 --seconds 10
    python -m tests.chaos.attacks slow  --port 8000 --count 2000 --seconds 10
    python -m tests.chaos.attacks huge  --port 8000 --count 4    --seconds 10 --header-mb 50
    python -m tests.chaos.attacks unread --port 8000 --count 20  --seconds 10
    python -m tests.chaos.attacks scrape --port 9000 --count 8   --seconds 10

- `idle`: `count` connections that never send a byte; one the server closes is opened again.
- `slow`: `count` connections sending a request head one byte a second (slowloris);
  reopened when closed.
- `huge`: `count` clients, each sending requests with one `header-mb` MB header in a loop.
- `unread`: `count` connections pipelining score requests without ever reading an answer;
  reopened when the server closes them.
- `scrape`: `count` clients, each scraping `GET /metrics` on `--port` (the operational port)
  back to back over one kept-alive connection (a metrics flood).

Loopback only; bounded by `--seconds`. Prints one JSON line of counters at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import time
from collections import Counter

HOST = "127.0.0.1"


async def _connect(port: int, counts: Counter[str]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    """A new connection, or None (counted, after a short pause) when it cannot be made."""
    try:
        reader, writer = await asyncio.open_connection(HOST, port)
    except OSError:
        counts["connect_failed"] += 1
        await asyncio.sleep(0.2)
        return None
    counts["connected"] += 1
    return reader, writer


async def _idle(port: int, stop_at: float, counts: Counter[str]) -> None:
    while time.monotonic() < stop_at:
        if (conn := await _connect(port, counts)) is None:
            continue
        reader, writer = conn
        try:
            async with asyncio.timeout(max(0.0, stop_at - time.monotonic())):
                await reader.read(1)  # EOF (or a reset) when the server closes it
            counts["closed_by_server"] += 1
        except TimeoutError:
            pass
        except OSError:
            counts["closed_by_server"] += 1
        writer.close()
        await asyncio.sleep(0.05)


async def _slow(port: int, stop_at: float, counts: Counter[str]) -> None:
    head = b"POST /v1/fraud/score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Pad: " + b"a" * 4096
    while time.monotonic() < stop_at:
        if (conn := await _connect(port, counts)) is None:
            continue
        reader, writer = conn
        try:
            for byte in head:
                if time.monotonic() >= stop_at:
                    break
                writer.write(bytes([byte]))
                await writer.drain()
                try:
                    async with asyncio.timeout(1.0):
                        answer = await reader.read(64)
                except TimeoutError:
                    continue
                status = answer[9:12].decode("latin-1") if answer.startswith(b"HTTP/") else "closed"
                counts[f"answered_{status}"] += 1
                break
        except OSError:
            counts["reset"] += 1
        writer.close()


async def _huge(port: int, stop_at: float, counts: Counter[str], header_mb: int) -> None:
    big = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (header_mb << 20) + b"\r\n\r\n"
    while time.monotonic() < stop_at:
        if (conn := await _connect(port, counts)) is None:
            continue
        reader, writer = conn
        try:
            writer.write(big)
            async with asyncio.timeout(10):
                await writer.drain()
                answer = await reader.read(64)
            status = answer[9:12].decode("latin-1") if answer.startswith(b"HTTP/") else "closed"
            counts[f"answered_{status}"] += 1
        except (OSError, TimeoutError) as exc:
            counts[type(exc).__name__] += 1
        writer.close()
        await asyncio.sleep(0.5)


async def _unread(port: int, stop_at: float, counts: Counter[str]) -> None:
    body = json.dumps(
        {"transaction_id": "t-1", "user_id": "u-1", "amount": 129.5, "currency": "INR",
         "merchant_category": "pharmacy", "timestamp": "2026-10-27T06:22:27+05:30",
         "device": {"id": "d-1", "os": "macos", "is_new": False}, "location": {"lat": 12.77, "lon": 77.62},
         "user_history": {"txn_count_24h": 1, "avg_amount_30d": 102.9,
                          "last_location": {"lat": 12.9, "lon": 77.6}, "account_age_days": 2417}}
    ).encode()  # fmt: skip
    request = (
        b"POST /v1/fraud/score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + b"Content-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )
    while time.monotonic() < stop_at:
        if (conn := await _connect(port, counts)) is None:
            continue
        _, writer = conn
        try:
            while time.monotonic() < stop_at:
                writer.write(request * 16)
                async with asyncio.timeout(max(0.01, stop_at - time.monotonic())):
                    await writer.drain()
            counts["held_to_the_end"] += 1
        except TimeoutError:
            counts["held_to_the_end"] += 1
        except OSError:
            counts["closed_by_server"] += 1
        writer.close()
        await asyncio.sleep(0.05)


async def _scrape(port: int, stop_at: float, counts: Counter[str]) -> None:
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    while time.monotonic() < stop_at:
        if (conn := await _connect(port, counts)) is None:
            continue
        reader, writer = conn
        try:
            while time.monotonic() < stop_at:
                writer.write(request)
                async with asyncio.timeout(10):
                    head = await reader.readuntil(b"\r\n\r\n")
                    length = next(
                        int(line.split(b":", 1)[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    )
                    await reader.readexactly(length)
                counts[f"answered_{head[9:12].decode('latin-1')}"] += 1
        except (OSError, TimeoutError, StopIteration, asyncio.IncompleteReadError) as exc:
            counts[type(exc).__name__] += 1
        writer.close()


async def main(args: argparse.Namespace) -> Counter[str]:
    counts: Counter[str] = Counter()
    stop_at = time.monotonic() + args.seconds
    if args.kind == "idle":
        jobs = [_idle(args.port, stop_at, counts) for _ in range(args.count)]
    elif args.kind == "slow":
        jobs = [_slow(args.port, stop_at, counts) for _ in range(args.count)]
    elif args.kind == "unread":
        jobs = [_unread(args.port, stop_at, counts) for _ in range(args.count)]
    elif args.kind == "scrape":
        jobs = [_scrape(args.port, stop_at, counts) for _ in range(args.count)]
    else:
        jobs = [_huge(args.port, stop_at, counts, args.header_mb) for _ in range(args.count)]
    await asyncio.gather(*jobs)
    return counts


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["idle", "slow", "huge", "unread", "scrape"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--header-mb", type=int, default=50)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print(json.dumps(asyncio.run(main(parser.parse_args()))))
