"""The compose stack, run for real: up, score, scale serving under load, stop a replica, down.

    deploy/compose/compose-test.sh        # what `make compose-test` runs (engine setup, images, this)

Runs docker-compose.yml with our model server's image as `serving` (SERVING_IMAGE), then:

1. writes a fresh API key's digest to a key folder of its own (API_AUTH_DIR: authentication is
   on in the stack), `up -d`, waits until every container's healthcheck says healthy;
2. checks that a score without the key is refused (401), then scores examples/transaction.json
   with it through the API's published port;
3. under a steady load of score requests, scales serving from 1 to 3 replicas (and the API
   to 2, each on its own host port from API_PORTS) and waits until every serving replica
   has answered some of them: each replica's own count comes from its Prometheus page
   (`:tensorflow:serving:request_count{model_name="fraud",status="OK"}`), read inside the
   container;
4. still under load, stops one serving replica (SIGTERM, then its grace period);
5. tears everything down (also on failure), and fails if any request of the load failed;
6. the second scenario, one's own model through deploy/compose/own-model.override.yml exactly
   as docs/deploying.md says: the iris SavedModel exported and its route scaffolded into
   my-model/ (docs/own-model.md's first steps, with the venv's Python), then the commands of the
   page's block marked `<!-- compose-test: own-model -->` run as written (`docker compose` is
   the engine's compose command with this test's project name; the curl waits for healthy and
   goes to the published port), the answer checked, and down.

Standard library only, so it runs with any Python 3.11 (the host's). Expects ENGINE
(docker or podman) and COMPOSE (the compose command, space-separated) in the environment,
as `engine.sh` sets them. Under podman without systemd nothing runs healthchecks on a
timer, so a thread here runs `podman healthcheck run` for the project's containers every
2 s while the stack is up.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import re
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROJECT = "tfserve-compose-test"
# The request_count sample of one replica for the fraud model's successful requests.
_OK_COUNT = re.compile(r'^:tensorflow:serving:request_count\{([^}]*)\}\s+([0-9.eE+]+)', re.M)
# Read serving's Prometheus page from inside its container: both the official image and
# ours have bash, neither needs curl.
_METRICS_CMD = (
    "exec 3<>/dev/tcp/127.0.0.1/8501 && "
    "printf 'GET /monitoring/prometheus/metrics HTTP/1.0\\r\\n\\r\\n' >&3 && cat <&3"
)

_started = time.monotonic()
# The API key every request of this test sends (set by `write_key_folder`).
_KEY = "tfs_" + secrets.token_urlsafe(32)


def log(message: str) -> None:
    print(f"compose-test [{time.monotonic() - _started:6.1f}s] {message}", flush=True)


class Stack:
    """The compose project and its engine."""

    def __init__(self, engine: str, compose: Sequence[str], env: dict[str, str]) -> None:
        self.engine = engine
        self.compose = [*compose, "-p", PROJECT, "-f", str(REPO / "docker-compose.yml")]
        self.env = env

    def run(self, *args: str, check: bool = True, timeout: float = 600) -> str:
        done = subprocess.run(
            list(args), cwd=REPO, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def compose_run(self, *args: str, timeout: float = 600) -> str:
        return self.run(*self.compose, *args, timeout=timeout)

    def containers(self, service: str | None = None) -> list[str]:
        """Ids of the project's running containers (of one service)."""
        labels = [f"label=com.docker.compose.project={PROJECT}"]
        if service:
            labels.append(f"label=com.docker.compose.service={service}")
        args = [self.engine, "ps", "-q", "--no-trunc"]
        for label in labels:
            args += ["--filter", label]
        return [line for line in self.run(*args).split() if line]

    def inspect(self, container: str, template: str) -> str:
        return self.run(self.engine, "inspect", "--format", template, container, check=False).strip()

    def name(self, container: str) -> str:
        return self.inspect(container, "{{.Name}}").lstrip("/")

    def health(self, container: str) -> str:
        return self.inspect(container, "{{.State.Health.Status}}")

    def wait_healthy(self, service: str, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ids = self.containers(service)
            states = [self.health(c) for c in ids]
            if len(ids) >= count and all(s == "healthy" for s in states):
                return
            time.sleep(1)
        raise TimeoutError(f"{service}: not {count} healthy containers after {timeout_s:.0f} s: {states}")

    def request_count(self, container: str) -> int:
        """The replica's own count of successful fraud-model requests (TF Serving's metric)."""
        page = self.run(self.engine, "exec", container, "bash", "-c", _METRICS_CMD, timeout=30)
        total = 0.0
        for labels, value in _OK_COUNT.findall(page):
            if 'model_name="fraud"' in labels and 'status="OK"' in labels:
                total += float(value)
        return int(total)

    def counts(self) -> dict[str, int]:
        return {self.name(c): self.request_count(c) for c in self.containers("serving")}


class HealthPump(threading.Thread):
    """Runs `podman healthcheck run` on the project's containers every 2 s (podman only)."""

    def __init__(self, stack: Stack) -> None:
        super().__init__(daemon=True)
        self.stack = stack
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(2.0):
            try:
                for container in self.stack.containers():
                    self.stack.run("podman", "healthcheck", "run", container, check=False, timeout=30)
            except Exception as exc:  # the stack may be going down; keep pumping
                print(f"compose-test: healthcheck pump: {exc}", file=sys.stderr)


class Load(threading.Thread):
    """Score requests in a loop on a few keep-alive connections, counting every outcome."""

    def __init__(self, port: int, body: bytes, connections: int = 4, pause_s: float = 0.01) -> None:
        super().__init__(daemon=True)
        self.port, self.body, self.connections, self.pause_s = port, body, connections, pause_s
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.ok = 0
        self.failed: list[str] = []

    def run(self) -> None:
        workers = [threading.Thread(target=self._worker, daemon=True) for _ in range(self.connections)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()

    def _worker(self) -> None:
        conn: http.client.HTTPConnection | None = None
        while not self.stop.is_set():
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
                conn.request("POST", "/v1/fraud/score", self.body, _headers())
                response = conn.getresponse()
                text = response.read()
                outcome = None if response.status == 200 else f"{response.status} {text[:200]!r}"
            except (OSError, http.client.HTTPException) as exc:
                outcome = f"{type(exc).__name__}: {exc}"
                if conn is not None:
                    conn.close()
                conn = None
            with self.lock:
                if outcome is None:
                    self.ok += 1
                else:
                    self.failed.append(outcome)
            time.sleep(self.pause_s)
        if conn is not None:
            conn.close()

    def snapshot(self) -> tuple[int, int]:
        with self.lock:
            return self.ok, len(self.failed)


def published_port(stack: Stack, index: int = 1) -> int:
    text = stack.compose_run("port", "--index", str(index), "api", "8000").strip()
    return int(text.rsplit(":", 1)[1])


def _headers(key: str | None = _KEY) -> dict[str, str]:
    return {"content-type": "application/json", **({"x-api-key": key} if key else {})}


def write_key_folder() -> Path:
    """A folder with an API key file listing `_KEY`'s SHA-256 (the format of api.security.api_keys),
    readable by the API container's user."""
    folder = Path(tempfile.mkdtemp(prefix="compose-test-auth-"))
    folder.chmod(0o755)
    path = folder / "api-keys"
    path.write_text(f"compose-test sha256:{hashlib.sha256(_KEY.encode()).hexdigest()}\n")
    path.chmod(0o644)
    return folder


def refused_without_key(port: int, body: bytes) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("POST", "/v1/fraud/score", body, _headers(None))
    response = conn.getresponse()
    text = response.read()
    if response.status != 401 or not response.getheader("www-authenticate", "").startswith("Bearer"):
        raise AssertionError(f"score without a key via port {port}: {response.status} {text!r}")


def score_once(port: int, body: bytes) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("POST", "/v1/fraud/score", body, _headers())
    response = conn.getresponse()
    text = response.read()
    if response.status != 200:
        raise AssertionError(f"score via port {port}: {response.status} {text!r}")
    return json.loads(text)


def wait_spread(stack: Stack, base: dict[str, int], replicas: int, timeout_s: float) -> dict[str, int]:
    """Counts since `base` once all `replicas` serving containers have answered some calls."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = stack.counts()
        delta = {name: count - base.get(name, 0) for name, count in now.items()}
        if len(delta) >= replicas and all(v > 0 for v in delta.values()):
            return delta
        if time.monotonic() > deadline:
            raise AssertionError(f"load not spread over {replicas} replicas in {timeout_s:.0f} s: {delta}")
        time.sleep(1)


OWN_MODEL_MARK = "<!-- compose-test: own-model -->"


def documented_commands(page: Path, mark: str) -> list[str]:
    """The `$ ` commands of the console block after `mark` on `page`, continuation lines joined."""
    text = page.read_text()
    block = text[text.index(mark) :].split("```", 2)[1]
    commands: list[str] = []
    pending = ""
    for line in block.splitlines()[1:]:
        if pending:
            pending += " " + line.strip()
        elif line.startswith("$ "):
            pending = line[2:]
        else:
            continue
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
        else:
            commands.append(pending)
            pending = ""
    return commands


def own_model_scenario(stack: Stack, venv_python: str) -> None:
    """Scenario 2: the iris example as one's own model, through the override, as the docs say."""
    project = REPO / "my-model"
    if project.exists():
        subprocess.run(["rm", "-rf", str(project)], check=True)
    log("own model: exporting the iris SavedModel and scaffolding its route into my-model/")
    stack.run(venv_python, "examples/own_model/export.py", "my-model/models/iris", timeout=600)
    stack.run(venv_python, "-m", "api.model_routes.scaffold", "--saved-model", "my-model/models/iris", "--name", "iris")
    commands = documented_commands(REPO / "docs" / "deploying.md", OWN_MODEL_MARK)
    compose = " ".join(stack.compose[:-2])  # with -p, without -f: the page names its files
    exports = [c for c in commands if c.startswith("export ")]
    try:
        for command in commands:
            if command.startswith("export "):
                continue
            if command.startswith("curl "):
                stack.wait_healthy("serving", 1, 300)
                stack.wait_healthy("api", 1, 120)
                port = published_port(stack)
                command = command.replace("127.0.0.1:8000", f"127.0.0.1:{port}")
            command = command.replace("docker compose", compose)
            log(f"own model: $ {command}")
            out = stack.run("bash", "-c", "; ".join([*exports, command]), timeout=600)
            if command.startswith("curl "):
                answer = json.loads(out)
                log(f"own model: scored a flower through the override: {out.strip()}")
                assert answer["model"] == {"name": "iris", "version": 1}, answer
                assert len(answer["probabilities"]) == 3 and abs(sum(answer["probabilities"]) - 1) < 1e-4, answer
    finally:
        stack.run("bash", "-c", "; ".join([*exports, f"{compose} -f docker-compose.yml -f "
                                           "deploy/compose/own-model.override.yml down --remove-orphans"]),
                  check=False, timeout=300)  # fmt: skip
        subprocess.run(["rm", "-rf", str(project)], check=False)
        log("own model: down")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serving-image", default="tfserve-split/serving:0.1.0")
    parser.add_argument(
        "--api-ports",
        help="API_PORTS: host ports of the API replicas (default: the range 18000-18009; under podman, "
        "whose Docker API refuses ranges, 0: a free port each)",
    )
    parser.add_argument("--spread-s", type=float, default=8.0, help="load kept on 3 replicas before counting")
    parser.add_argument("--venv-python", default=str(REPO / ".venv" / "bin" / "python"),
                        help="the project's venv Python (make install): exports and scaffolds the own model")
    parser.add_argument("--skip-own-model", action="store_true", help="only the first scenario")
    args = parser.parse_args(argv)

    engine = os.environ["ENGINE"]
    compose = os.environ["COMPOSE"].split()
    api_ports = args.api_ports or ("0" if engine == "podman" else "18000-18009")
    env = {**os.environ, "SERVING_IMAGE": args.serving_image, "API_PORTS": api_ports,
           "API_AUTH_DIR": str(write_key_folder()), "KEY": _KEY}  # KEY: docs/deploying.md's curl sends it
    stack = Stack(engine, compose, env)
    body = (REPO / "examples" / "transaction.json").read_bytes()
    official = "tensorflow/serving" in args.serving_image
    log(f"API_PORTS={api_ports}")
    log(
        f"serving image: {args.serving_image}"
        + ("" if official else " (our model server, Dockerfile.serving: the official image cannot be pulled here)")
    )
    timings: dict[str, float] = {}
    pump = HealthPump(stack) if engine == "podman" else None
    if pump is not None:
        pump.start()
    load: Load | None = None
    try:
        stack.compose_run("down", "--remove-orphans", timeout=120)  # leftovers of an interrupted run
        t = time.monotonic()
        stack.compose_run("up", "-d", timeout=600)
        stack.wait_healthy("serving", 1, 300)
        stack.wait_healthy("api", 1, 120)
        timings["up to healthy"] = time.monotonic() - t
        log(f"up: serving and api healthy in {timings['up to healthy']:.1f} s")

        port = published_port(stack)
        refused_without_key(port, body)
        log("a score without an API key: 401 with WWW-Authenticate")
        answer = score_once(port, body)
        log(f"scored examples/transaction.json via 127.0.0.1:{port}: {json.dumps(answer)}")
        assert answer["transaction_id"] and 0.0 <= answer["fraud_score"] <= 1.0, answer

        load = Load(port, body)
        load.start()
        time.sleep(2)
        base = stack.counts()
        t = time.monotonic()
        stack.compose_run("up", "-d", "--no-recreate", "--scale", "serving=3", "--scale", "api=2", timeout=600)
        stack.wait_healthy("serving", 3, 300)
        stack.wait_healthy("api", 2, 120)
        timings["scale to 3 healthy"] = time.monotonic() - t
        log(f"scaled serving to 3 (api to 2) under load: healthy in {timings['scale to 3 healthy']:.1f} s")
        t = time.monotonic()
        wait_spread(stack, base, 3, 60)
        timings["new replicas get calls"] = time.monotonic() - t
        log(f"every serving replica answered calls {timings['new replicas get calls']:.1f} s after healthy")
        second = published_port(stack, 2)
        log(f"second API replica on its own host port {second}: {score_once(second, body)['fraud_score']}")
        before = stack.counts()
        ok_before, _ = load.snapshot()
        time.sleep(args.spread_s)
        after = stack.counts()
        ok_after, failed = load.snapshot()
        spread = {name: after[name] - before.get(name, 0) for name in after}
        log(f"{ok_after - ok_before} requests in {args.spread_s:.0f} s on 3 replicas, {failed} failed so far")

        victim = stack.containers("serving")[0]
        victim_name = stack.name(victim)
        t = time.monotonic()
        stack.run(engine, "stop", "-t", "10", victim)
        timings["stop one replica"] = time.monotonic() - t
        ok_mid, _ = load.snapshot()
        time.sleep(5)
        ok_end, failed = load.snapshot()
        log(f"stopped {victim_name} under load in {timings['stop one replica']:.1f} s; "
            f"{ok_end - ok_mid} requests answered in the 5 s after it, {failed} failed so far")
        load.stop.set()
        load.join(30)
    finally:
        if load is not None:
            load.stop.set()
        t = time.monotonic()
        try:
            stack.compose_run("down", "--remove-orphans", timeout=300)
        finally:
            if pump is not None:
                pump.stop.set()
        timings["down"] = time.monotonic() - t
        log(f"down in {timings['down']:.1f} s")

    assert load is not None
    log("timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))
    if load.failed:
        log(f"FAILED: {len(load.failed)} of {load.ok + len(load.failed)} requests failed; first: {load.failed[:5]}")
        return 1
    log(f"all {load.ok} requests under load answered 200 (zero failed)")
    if not args.skip_own_model:
        pump = HealthPump(stack) if engine == "podman" else None
        if pump is not None:
            pump.start()
        try:
            own_model_scenario(stack, args.venv_python)
        finally:
            if pump is not None:
                pump.stop.set()
    log(f"per-replica requests (each replica's own :tensorflow:serving:request_count, fraud, OK) "
        f"during {args.spread_s:.0f} s on 3 replicas:")
    for name, count in sorted(spread.items()):
        log(f"  {name}: {count}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
