"""Replica discovery against a real DNS server, inside a private network and mount namespace.

    unshare --net --mount --fork python -m tests.api.discovery_netns --protocol rest --tmp DIR

Run by `tests/api/test_discovery_dns.py`, which reads the JSON line it prints last. Inside
the namespaces (nothing leaves them): loopback is brought up; a dnslib authoritative DNS
server answers `serving.test.` over UDP on 127.0.0.1:53 from a zone the scenario changes;
/etc/resolv.conf is bind-mounted (in this mount namespace only) to point at it, so the API
resolves through the system resolver exactly as in a container; fake serving replicas
listen on 127.0.0.2, 127.0.0.3 and 127.0.0.4 (Linux routes all of 127/8 to loopback), each
on TF Serving's ports; the API (one uvicorn process) gets `SERVING_URL=http://serving.test:8501`
(or `SERVING_GRPC_TARGETS=serving.test:8500`) and a steady load of score requests while:

1. the zone lists .2 and .3: both get calls;
2. .4 is added to the zone: how long until it gets calls;
3. .2 is removed from the zone: how long until it gets no more calls; then it is stopped;
4. (REST) .3 is stopped while still in the zone, then removed: calls retry elsewhere.

Every request of the load must succeed.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from dnslib import QTYPE, RR, A, DNSRecord
from dnslib.server import BaseResolver, DNSServer

from tests.api.stack import FakeServing, transactions
from tests.support import Process, free_port, start_api, wait_until

NAME = "serving.test."
REPLICAS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
REST_PORT, GRPC_PORT = 8501, 8500
RESOLVE_INTERVAL_S = 0.5


class Zone(BaseResolver):
    """An authoritative answer for NAME from a mutable address list (TTL 0: never cached)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.addresses: list[str] = []
        self.queries = 0

    def set(self, addresses: list[str]) -> None:
        with self.lock:
            self.addresses = list(addresses)

    def resolve(self, request: DNSRecord, handler: Any) -> DNSRecord:
        reply = request.reply()
        qname = request.q.qname
        with self.lock:
            self.queries += 1
            addresses = list(self.addresses)
        if str(qname).lower() != NAME:
            reply.header.rcode = 3  # NXDOMAIN
        elif request.q.qtype in (QTYPE.A, QTYPE.ANY):
            for address in addresses:
                reply.add_answer(RR(qname, QTYPE.A, rdata=A(address), ttl=0))
        # AAAA: NOERROR with no answer (the name exists, IPv4 only).
        return reply


def setup_namespace(tmp: Path) -> None:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    resolv = tmp / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:2\n")
    subprocess.run(["mount", "--bind", str(resolv), "/etc/resolv.conf"], check=True)


class Load(threading.Thread):
    """Score requests on a few connections until stopped; every outcome counted."""

    def __init__(self, url: str, connections: int = 4) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.connections = connections
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.ok = 0
        self.failed: list[str] = []
        self.bodies = transactions(64)

    def run(self) -> None:
        workers = [threading.Thread(target=self._worker, args=(i,), daemon=True) for i in range(self.connections)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()

    def _worker(self, index: int) -> None:
        with httpx.Client(timeout=10, trust_env=False) as client:
            i = index
            while not self.stop.is_set():
                body = self.bodies[i % len(self.bodies)]
                i += self.connections
                try:
                    response = client.post(self.url + "/v1/fraud/score", json=body)
                    failure = None if response.status_code == 200 else f"{response.status_code} {response.text[:200]}"
                except httpx.HTTPError as exc:
                    failure = f"{type(exc).__name__}: {exc}"
                with self.lock:
                    if failure is None:
                        self.ok += 1
                    else:
                        self.failed.append(failure)
                time.sleep(0.005)


def predicts(host: str) -> int:
    """How many predicts the fake replica on `host` has run (its own count)."""
    return len(httpx.get(f"http://{host}:{REST_PORT}/_fake/stats", timeout=5, trust_env=False).json()["batches"])


def counts() -> dict[str, int]:
    out = {}
    for host in REPLICAS:
        try:
            out[host] = predicts(host)
        except httpx.HTTPError:
            out[host] = -1  # stopped
    return out


def wait_for(predicate: Any, timeout_s: float, step_s: float = 0.05) -> float:
    """Seconds until `predicate()` held; raises after `timeout_s`."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"condition not met in {timeout_s} s")
        time.sleep(step_s)
    return time.monotonic() - started


def scenario(protocol: str, tmp: Path) -> dict[str, Any]:
    zone = Zone()
    zone.set(list(REPLICAS[:2]))
    dns = DNSServer(zone, address="127.0.0.1", port=53)
    dns.start_thread()
    result: dict[str, Any] = {"protocol": protocol}
    fakes: dict[str, FakeServing] = {}
    api_proc: Process | None = None
    load: Load | None = None
    try:
        infos = socket.getaddrinfo("serving.test", REST_PORT, type=socket.SOCK_STREAM)
        resolved = sorted({info[4][0] for info in infos})
        assert resolved == list(REPLICAS[:2]), resolved
        for host in REPLICAS:
            args = [sys.executable, "-m", "tests.api.fake_serving", f"--host={host}", f"--rest-port={REST_PORT}"]
            if protocol == "grpc":
                args.append(f"--grpc-port={GRPC_PORT}")
            proc = Process(args, tmp / f"fake-{host}.log", env={"TF_CPP_MIN_LOG_LEVEL": "3"})
            fakes[host] = FakeServing(proc, REST_PORT, GRPC_PORT if protocol == "grpc" else 0)
        for host, fake in fakes.items():
            wait_until(lambda host=host, fake=fake: fake.proc.alive() and _answers(host), 120, f"fake on {host}")

        env = {
            "SERVING_RESOLVE_INTERVAL_S": str(RESOLVE_INTERVAL_S),
            "SERVING_PROTOCOL": protocol,
            "SERVING_GRPC_TARGETS": f"serving.test:{GRPC_PORT}",
            "EVENTS_JSONL_PATH": str(tmp / "events.jsonl"),
            "ACCESS_LOG": "false",
            "LOG_LEVEL": "INFO",
        }
        api_port = free_port()
        api_proc = start_api(api_port, f"http://serving.test:{REST_PORT}", tmp / "api.log", **env)
        api_url = f"http://127.0.0.1:{api_port}"
        wait_until(lambda: _ok(api_url + "/readyz"), 60, "API /readyz")

        load = Load(api_url)
        load.start()
        base = counts()
        time.sleep(1.5)
        phase1 = _delta(base, counts())
        result["two_replicas"] = phase1

        # 2. a replica appears in DNS
        before = counts()
        zone.set(list(REPLICAS))
        result["added_after_s"] = wait_for(lambda: predicts(REPLICAS[2]) > before[REPLICAS[2]], 10)
        time.sleep(1.0)
        result["three_replicas"] = _delta(before, counts())

        # 3. a replica leaves DNS: no new calls once the next lookup drops it, then it stops
        zone.set(list(REPLICAS[1:]))
        removed_at = time.monotonic()
        last = {"count": predicts(REPLICAS[0]), "at": removed_at}

        def settled() -> bool:
            now = predicts(REPLICAS[0])
            if now != last["count"]:
                last.update(count=now, at=time.monotonic())
            return time.monotonic() - last["at"] > 1.0

        wait_for(settled, 15)
        result["removed_last_call_after_s"] = last["at"] - removed_at
        before_stop = counts()
        fakes[REPLICAS[0]].proc.stop()
        time.sleep(1.0)
        result["after_removal"] = _delta(before_stop, counts())

        # 4. a replica stops while DNS still lists it (REST: the fake's gRPC side stops
        # without a grace period, which no client could retry across)
        if protocol == "rest":
            fakes[REPLICAS[1]].proc.stop()
            time.sleep(2.0)
            zone.set([REPLICAS[2]])
            time.sleep(1.0)
        load.stop.set()
        load.join(30)
        result["ok"] = load.ok
        result["failed"] = len(load.failed)
        result["failures"] = load.failed[:5]
        result["dns_queries"] = zone.queries
        result["api_log_tail"] = [line for line in api_proc.log().splitlines() if "replica" in line][-12:]
        return result
    finally:
        if load is not None:
            load.stop.set()
        if api_proc is not None:
            api_proc.stop()
        for fake in fakes.values():
            fake.proc.stop()
        dns.stop()


def _answers(host: str) -> bool:
    return _ok(f"http://{host}:{REST_PORT}/v1/models/fraud")


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1.0, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def _delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {host: after[host] - before[host] for host in REPLICAS if after[host] >= 0 and before[host] >= 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocol", choices=("rest", "grpc"), required=True)
    parser.add_argument("--tmp", type=Path, required=True)
    args = parser.parse_args()
    setup_namespace(args.tmp)
    print(json.dumps(scenario(args.protocol, args.tmp)), flush=True)


if __name__ == "__main__":
    main()
