"""gunicorn + uvicorn workers against a real serving tier.

Starts `python -m serving` and `gunicorn -c gunicorn.conf.py 'api.app:create_app()'`
with two workers on loopback, as a user does (no `PROMETHEUS_MULTIPROC_DIR` given),
scores requests, and checks that `/metrics` merges every worker's numbers
(prometheus-client multiprocess mode), that each worker stays small and free of
TensorFlow, and that SIGTERM stops the server with exit status 0 and removes the metrics
directory it made.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from api.ops.cpu_budget import available_cpus
from models.transactions import generate_transactions
from tests.support import (
    REPO,
    Serving,
    free_port,
    http_ok,
    ops_url,
    start_gunicorn,
    wait_until,
)

WORKERS = 2
RSS_LIMIT_KB = 80 * 1024
N_REQUESTS = 60
MAX_REQUESTS = 400
FRAUD_COUNT = "api_request_duration_seconds_count"
STAGE_COUNT = "api_request_stage_duration_seconds_count"


@pytest.fixture(scope="module")
def serving(example_serving: Serving) -> str:
    return example_serving.rest_url


def children(pid: int) -> list[int]:
    """Direct child processes of `pid` (from /proc/<pid>/task/*/children)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def vm_rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def maps_tensorflow(pid: int) -> bool:
    """True when any TensorFlow shared library is mapped into the process."""
    return "tensorflow" in Path(f"/proc/{pid}/maps").read_text()


def scored_by_worker(prom_dir: Path, workers: list[int]) -> dict[int, float]:
    """Fraud requests each worker recorded, read from its own multiprocess file."""
    counts = {}
    for pid in workers:
        files = [str(p) for p in prom_dir.glob(f"histogram_{pid}.db")]
        metrics = MultiProcessCollector.merge(files) if files else []
        counts[pid] = sum(
            s.value
            for m in metrics
            for s in m.samples
            if s.name == FRAUD_COUNT and s.labels.get("route") == "/v1/fraud/score"
        )
    return counts


def metric_total(text: str, name: str, **labels: str) -> float:
    return sum(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def test_two_workers_share_metrics_stay_small_and_stop_cleanly(
    serving: str, tmp_path: Path
) -> None:
    assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ  # the config must make its own
    port = free_port()
    events = tmp_path / "events.jsonl"
    tmp_dir = tmp_path / "tmp"  # where the master makes its metrics directory
    tmp_dir.mkdir()
    gunicorn = start_gunicorn(
        tmp_path / "gunicorn.log",
        WEB_CONCURRENCY=str(WORKERS),
        API_BIND=f"127.0.0.1:{port}",
        SERVING_URL=serving,
        EVENTS_JSONL_PATH=str(events),
        ACCESS_LOG="false",
        TMPDIR=str(tmp_dir),
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: gunicorn.alive() and http_ok(f"{base}/readyz"), 90, "gunicorn to be ready"
        )
        # /readyz may be answered by the first worker before the master forks the second.
        wait_until(lambda: len(children(gunicorn.popen.pid)) == WORKERS, 30, "both workers")
        workers = children(gunicorn.popen.pid)
        assert len(workers) == WORKERS, workers
        [prom_dir] = tmp_dir.glob("api-prometheus-*")

        bodies = [t.body for t in generate_transactions(MAX_REQUESTS, seed=11)]
        # Concurrent connections so both workers take requests.
        limits = httpx.Limits(max_connections=8)
        with (
            httpx.Client(base_url=base, timeout=10.0, limits=limits) as c,
            ThreadPoolExecutor(8) as pool,
        ):
            answers = list(
                pool.map(lambda b: c.post("/v1/fraud/score", json=b), bodies[:N_REQUESTS])
            )
        assert [a.status_code for a in answers] == [200] * N_REQUESTS, [a.text for a in answers if a.status_code != 200]
        sent = N_REQUESTS
        first = answers[0]
        assert first.headers["x-model-version"] == str(first.json()["model"]["version"])
        timing = first.headers["server-timing"]
        assert [p.split(";")[0] for p in timing.split(", ")] == [
            "validate",
            "features",
            "serving",
            "total",
            "arm",  # the rollout arm (`arm;desc=stable`), a metric with a description only
        ]
        # The kernel picks which worker accepts a connection; until both have scored
        # some requests, send more, each on a new connection (bounded).
        while min(scored_by_worker(prom_dir, workers).values()) == 0 and sent < MAX_REQUESTS:
            assert httpx.post(f"{base}/v1/fraud/score", json=bodies[sent], timeout=10.0).is_success
            sent += 1
        # A worker records a request's metrics after its answer is sent: wait for the last ones.
        wait_until(lambda: sum(scored_by_worker(prom_dir, workers).values()) == sent, 10, "every request recorded")
        per_worker = scored_by_worker(prom_dir, workers)
        assert min(per_worker.values()) > 0, per_worker

        # Every scrape of the operational port sees every worker's requests; the public port
        # serves neither the metrics nor the docs.
        assert httpx.get(f"{base}/metrics", timeout=10.0).status_code == 404
        assert httpx.get(f"{base}/docs", timeout=10.0).status_code == 404
        wait_until(lambda: http_ok(ops_url(gunicorn) + "/healthz"), 30, "the operational port")
        assert "swagger-ui-bundle.js" in httpx.get(ops_url(gunicorn) + "/docs", timeout=10.0).text
        assert httpx.get(ops_url(gunicorn) + "/docs/assets/swagger-ui-bundle.js", timeout=10.0).status_code == 200
        assert "/v1/fraud/score" in httpx.get(ops_url(gunicorn) + "/openapi.json", timeout=10.0).json()["paths"]
        for _ in range(4):
            text = httpx.get(ops_url(gunicorn) + "/metrics", timeout=10.0).text
            assert metric_total(text, FRAUD_COUNT, route="/v1/fraud/score", status="200") == sent
            assert metric_total(text, STAGE_COUNT, stage="serving") == sent
        rss = {pid: vm_rss_kb(pid) for pid in [gunicorn.popen.pid, *workers]}
        print(f"\nVmRSS kB: master {rss[gunicorn.popen.pid]}, workers {[rss[w] for w in workers]}")
        for pid in workers:
            assert rss[pid] < RSS_LIMIT_KB, rss
            assert not maps_tensorflow(pid)
        assert not maps_tensorflow(gunicorn.popen.pid)
    finally:
        code = gunicorn.stop()
    log = gunicorn.log_path.read_text()
    assert code == 0, log[-4000:]
    assert "Traceback" not in log, log[-4000:]
    assert "Error while closing socket" not in log, log[-4000:]  # each listener closed once
    # Workers drained their score events on the way out.
    assert len(events.read_text().splitlines()) == sent
    # The directory the master made is gone with it.
    assert not prom_dir.exists()


def test_a_start_that_fails_leaves_no_metrics_directory(tmp_path: Path) -> None:
    """A configuration error stops gunicorn while it builds the app (before any worker):
    the metrics directory it had made in the temp dir is removed all the same."""
    gunicorn = start_gunicorn(
        tmp_path / "gunicorn.log", TMPDIR=str(tmp_path), API_BIND=f"127.0.0.1:{free_port()}", MODEL_ROUTES="nope"
    )
    assert gunicorn.popen.wait(60) != 0
    assert "MODEL_ROUTES: 'nope' is not an import path" in gunicorn.log()
    assert list(tmp_path.glob("api-prometheus-*")) == []


def test_gunicorn_config_derives_workers_and_threads_from_the_cpu_budget(tmp_path: Path) -> None:
    """The config, loaded the way gunicorn loads it, in a clean process."""
    probe = (
        "import json, os, runpy\n"
        "cfg = runpy.run_path('gunicorn.conf.py')\n"
        "keys = ('workers', 'worker_class', 'preload_app', 'bind')\n"
        "env = ('OMP_NUM_THREADS', 'MKL_NUM_THREADS', 'OPENBLAS_NUM_THREADS',\n"
        "       'PROMETHEUS_MULTIPROC_DIR')\n"
        "print(json.dumps({k: cfg[k] for k in keys} | {v: os.environ[v] for v in env}))\n"
        "print(os.path.isdir(os.environ['PROMETHEUS_MULTIPROC_DIR']))\n"
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("WEB_CONCURRENCY", "PROMETHEUS_MULTIPROC_DIR")
    }
    env = {k: v for k, v in env.items() if not k.endswith("_NUM_THREADS")}
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    first, made = out.stdout.splitlines()
    cfg = json.loads(first)
    cpus = available_cpus()
    assert cfg["workers"] == cpus
    assert cfg["worker_class"] == "api.http_server.worker.ApiUvicornWorker"
    assert cfg["preload_app"] is True
    assert cfg["OMP_NUM_THREADS"] == cfg["MKL_NUM_THREADS"] == cfg["OPENBLAS_NUM_THREADS"] == "1"
    assert "api-prometheus-" in cfg["PROMETHEUS_MULTIPROC_DIR"]
    assert made == "True"
    assert not Path(cfg["PROMETHEUS_MULTIPROC_DIR"]).exists()  # removed when the process exited

    # A directory it is given is kept, emptied of an earlier run's files.
    given = tmp_path / "prometheus"
    given.mkdir()
    (given / "counter_999999.db").write_bytes(b"stale from an earlier run")
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=REPO,
        env={**env, "PROMETHEUS_MULTIPROC_DIR": str(given)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[0])["PROMETHEUS_MULTIPROC_DIR"] == str(given)
    assert given.is_dir() and list(given.iterdir()) == []

    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=REPO,
        env={**env, "WEB_CONCURRENCY": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    cfg = json.loads(out.stdout.splitlines()[0])
    assert cfg["workers"] == 1
    assert cfg["OMP_NUM_THREADS"] == str(cpus)
