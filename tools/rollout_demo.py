"""`make rollout-demo`: watch a canary move, 0 -> 10 -> 50 -> 100 -> 0 %, under steady load.

    python -m tools.rollout_demo [--rate 100] [--step-s 6] [--weights 0,10,50,100,0] [--workers 2]

Runs both tiers on loopback: `python -m serving` with two versions of the fraud model (version
1: the committed export; version 2: trained on the fly with another seed by `models.fraud_variant`,
both in a temporary models directory, labelled `stable` -> 1 and `canary` -> 2 by models.config's
`version_labels`), and the API under gunicorn with its rollout in a watched file
(`ROLLOUTS__FILE`, docs/rollouts.md). It offers open-loop load (a request every 1/rate s, each on
an idle keep-alive connection or a new one, whatever the answers do), from 1,000 users (the
fraud route's rollout key is `user_id`), rewrites the rollout file at each step and prints, per
step, the requests sent, the answers by arm and version, the errors, and the p50/p99 latency
from each request's intended send time. Exits 1 when any request failed.

The load generator runs in this process, on the same cores as both tiers: its figures show
that nothing fails during the moves and how the split follows the weight, not capacity.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from models.transactions import generate_transactions
from tools.processes import REPO, Process, free_port, gunicorn_command, http_ok, start_serving

SCORE = "/v1/fraud/score"
#: Each request's own limit, seconds: an answer later than this counts as an error.
REQUEST_TIMEOUT_S = 10.0
#: At most this many connections to the API at once; more requests wait for one (their wait counts).
MAX_CONNECTIONS = 64
#: An idle connection is closed by the client after this, seconds: below the API's keep-alive
#: timeout (gunicorn.conf.py `keepalive = 5`), so a request never races the server closing it
#: (as httpx's keepalive_expiry does; measured here: at 5 s, 3 of 3,000 requests hit that race).
KEEPALIVE_EXPIRY_S = 4.0


class Connection:
    """One keep-alive HTTP/1.1 connection on loopback, written and parsed by hand (httpx costs
    about 2.6 ms of CPU per request on a 2-core machine, this a tenth of it: the load generator
    shares the cores with both tiers)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str) -> None:
        self.reader, self.writer, self.host = reader, writer, host

    @classmethod
    async def open(cls, url: str) -> Connection:
        """A connection to `url` (`http://host:port`)."""
        host, _, port = url.removeprefix("http://").partition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        return cls(reader, writer, f"{host}:{port}")

    async def post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        """POST a JSON `body`: (status, headers with lower-case names, body); the connection stays open.

        Raises:
            OSError, asyncio.IncompleteReadError: the connection broke.
        """
        head = f"POST {path} HTTP/1.1\r\nhost: {self.host}\r\ncontent-type: application/json\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.writer.write(f"{head}content-length: {len(body)}\r\n\r\n".encode() + body)
        status_line, *lines = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        answer = {}
        for line in lines:
            name, sep, value = line.partition(":")
            if sep:
                answer[name.strip().lower()] = value.strip()
        return int(status_line.split()[1]), answer, await self.reader.readexactly(int(answer["content-length"]))

    def close(self) -> None:
        self.writer.close()


@dataclass
class Step:
    """One canary weight's requests: by (arm, version), errors, latencies in seconds."""

    weight: float
    sent: int = 0
    served: Counter[tuple[str, int]] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    latencies_s: list[float] = field(default_factory=list)

    def percentile(self, q: float) -> float:
        """The q-quantile of the latencies (nearest rank), milliseconds; nan without any."""
        if not self.latencies_s:
            return float("nan")
        ordered = sorted(self.latencies_s)
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def bodies(users: int, n: int) -> list[bytes]:
    """n fraud transactions from `users` users, encoded."""
    out = []
    for i, t in enumerate(generate_transactions(n, seed=23, fraud_rate=0.3)):
        out.append(json.dumps({**t.body, "user_id": f"user-{i % users}"}).encode())
    return out


def models_dir(root: Path) -> Path:
    """root/fraud/{1,2} and root/models.config (labels stable -> 1, canary -> 2); version 2 is trained."""
    shutil.copytree(REPO / "models" / "fraud" / "1", root / "fraud" / "1")
    print("training fraud version 2 (another seed, about 10 s) ...", flush=True)
    subprocess.run([sys.executable, "-m", "models.fraud_variant", str(root / "fraud" / "2")], check=True)
    config = root / "models.config"
    config.write_text(
        'model_config_list { config { name: "fraud" base_path: "%s" model_platform: "tensorflow"\n'
        "  model_version_policy { all {} }\n"
        '  version_labels { key: "stable" value: 1 } version_labels { key: "canary" value: 2 } } }\n' % (root / "fraud")
    )
    return config


def write_rollout(path: Path, weight: float) -> None:
    """The fraud route's rollout at `weight` % canary, replaced atomically (write, rename)."""
    staged = path.with_suffix(".staged")
    staged.write_text(json.dumps({"fraud": {"stable": "stable", "canary": "canary", "canary_weight": weight}}))
    staged.replace(path)


async def offer_load(
    url: str, payloads: list[bytes], rate: float, steps: list[Step], step_s: float, rollout: Path
) -> None:
    """Open loop at `rate`/s through every step; the rollout file is rewritten at each step's start."""
    idle: list[tuple[Connection, float]] = []  # (connection, when it was last used), most recent last

    def reuse() -> Connection | None:
        while idle:
            connection, used = idle.pop()
            if time.monotonic() - used < KEEPALIVE_EXPIRY_S:
                return connection
            connection.close()
        return None

    slots = asyncio.Semaphore(MAX_CONNECTIONS)
    tasks: set[asyncio.Task[None]] = set()

    async def one(step: Step, body: bytes, intended: float) -> None:
        async with slots:
            connection = reuse()
            try:
                async with asyncio.timeout(REQUEST_TIMEOUT_S):
                    connection = connection or await Connection.open(url)
                    status, headers, raw = await connection.post(SCORE, body, {})
            except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
                step.errors[type(exc).__name__] += 1
                if connection is not None:
                    connection.close()
                return
            step.latencies_s.append(time.monotonic() - intended)
            idle.append((connection, time.monotonic()))
            if status != 200:
                step.errors[f"HTTP {status}"] += 1
                return
            step.served[(headers.get("x-model-arm", "?"), json.loads(raw)["model"]["version"])] += 1

    gap = 1.0 / rate
    i = 0
    for step in steps:
        write_rollout(rollout, step.weight)
        start = time.monotonic()
        while (intended := start + step.sent * gap) < start + step_s:
            await asyncio.sleep(max(0.0, intended - time.monotonic()))
            task = asyncio.create_task(one(step, payloads[i % len(payloads)], intended))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            step.sent += 1
            i += 1
    await asyncio.gather(*tasks)
    for connection, _ in idle:
        connection.close()


def table(steps: list[Step]) -> str:
    """The per-step table (Markdown)."""
    rows = [
        "| step | canary weight | sent | stable (v1) | canary (v2) | canary share | errors | p50 ms | p99 ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for n, s in enumerate(steps, 1):
        stable = sum(c for (arm, _), c in s.served.items() if arm == "stable")
        canary = sum(c for (arm, _), c in s.served.items() if arm == "canary")
        share = 100 * canary / max(1, stable + canary)
        errors = sum(s.errors.values())
        detail = f" ({', '.join(f'{k}: {v}' for k, v in s.errors.items())})" if errors else ""
        rows.append(
            f"| {n} | {s.weight:g} % | {s.sent} | {stable} | {canary} | {share:.1f} % | {errors}{detail} "
            f"| {s.percentile(0.5):.1f} | {s.percentile(0.99):.1f} |"
        )
    odd = {key for s in steps for key in s.served if key not in {("stable", 1), ("canary", 2)}}
    if odd:
        rows.append(f"unexpected (arm, version) answers: {sorted(odd)}")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=100.0, help="requests per second, open loop")
    parser.add_argument("--step-s", type=float, default=6.0, help="seconds per canary weight")
    parser.add_argument("--weights", default="0,10,50,100,0", help="the canary weights, percent, in order")
    parser.add_argument("--workers", type=int, default=2, help="API (gunicorn) workers")
    args = parser.parse_args()
    steps = [Step(float(w)) for w in args.weights.split(",")]

    with tempfile.TemporaryDirectory(prefix="rollout-demo-") as tmp:
        root = Path(tmp)
        config = models_dir(root / "models")
        serving = start_serving(
            root / "serving.log", model_config_file=config, allow_version_labels_for_unavailable_models=True
        )
        api = None
        try:
            serving.wait_for_states("fraud", {1: "AVAILABLE", 2: "AVAILABLE"})
            rollout = root / "rollouts.json"
            write_rollout(rollout, steps[0].weight)
            port = free_port()
            env = {
                "API_BIND": f"127.0.0.1:{port}",
                "WEB_CONCURRENCY": str(args.workers),
                "MODEL_ROUTES": "examples.fraud.route:route",
                "SERVING_URL": serving.rest_url,
                "ROLLOUTS__FILE": str(rollout),
                "ACCESS_LOG": "false",
                "EVENTS_JSONL_PATH": str(root / "events.jsonl"),
            }
            api = Process(gunicorn_command(), root / "api.log", env=env)
            url = f"http://127.0.0.1:{port}"
            api.wait_ready(lambda: http_ok(url + "/readyz"), 90, "/readyz")
            print(f"both tiers up; {args.rate:g} requests/s open loop, {args.step_s:g} s per step", flush=True)
            asyncio.run(offer_load(url, bodies(1000, 5000), args.rate, steps, args.step_s, rollout))
        finally:
            if api is not None:
                api.stop()
            serving.process.stop()
    print(table(steps))
    failed = sum(sum(s.errors.values()) for s in steps)
    print("nothing failed during the moves" if not failed else f"{failed} requests failed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
