"""run-server.sh, the one-container mode: serving + gunicorn API supervised together."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.api.stack import run_load, transactions
from tests.support import (
    REPO,
    Process,
    free_port,
    http_ok,
    process_running,
    run_server_env,
    start_run_server,
    wait_run_server,
    wait_until,
)


def children_of(pid: int) -> set[int]:
    """All descendants of pid (from /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


@pytest.mark.parametrize(
    ("protocol", "sockets"), [("rest", "1"), ("grpc", "1"), ("rest", "0")],
    ids=["rest-unix-socket", "grpc-unix-socket", "rest-tcp"],
)
def test_run_server_serves_and_stops_cleanly(tmp_path: Path, protocol: str, sockets: str) -> None:
    # Free (never the default) ports: the API must follow GRPC_PORT / REST_API_PORT.
    env = one_worker_env(SERVING_PROTOCOL=protocol, SERVING_UNIX_SOCKETS=sockets, TMPDIR=str(tmp_path))
    api_port, rest_port, grpc_port = (int(env[k]) for k in ("API_PORT", "REST_API_PORT", "GRPC_PORT"))
    proc = start_run_server(tmp_path / "run-server.log", **env)
    api = f"http://127.0.0.1:{api_port}"
    try:
        wait_run_server(proc)
        assert http_ok(api + "/readyz")
        if sockets == "1":  # one container: the tiers talk over Unix-domain sockets
            serving_at = "(serving at gRPC unix:" if protocol == "grpc" else "(serving at unix:"
            (socket_dir,) = tmp_path.glob("serving-sockets.*")
            assert {p.name for p in socket_dir.iterdir()} == {"rest.sock", "grpc.sock"}
        else:
            serving_at = f"gRPC 127.0.0.1:{grpc_port}" if protocol == "grpc" else f":{rest_port}"
        assert serving_at in proc.log()
        body = (REPO / "examples" / "transaction.json").read_bytes()
        r = httpx.post(
            api + "/v1/fraud/score", content=body, headers={"content-type": "application/json"}
        )
        assert r.status_code == 200, r.text
        assert 0.0 <= r.json()["fraud_score"] <= 1.0
        descendants = children_of(proc.popen.pid)
        assert len(descendants) >= 3  # serving, gunicorn master, >= 1 worker
    finally:
        code = proc.stop(timeout_s=60)
    assert code == 0, proc.log()
    alive = [p for p in descendants if Path(f"/proc/{p}").exists()]
    assert not alive, f"left running: {alive}"
    assert not http_ok(api + "/healthz")
    assert not list(tmp_path.glob("serving-sockets.*"))  # removed with the tiers


def test_a_second_sigterm_during_the_stop_still_stops_both_tiers(tmp_path: Path) -> None:
    env = one_worker_env(TMPDIR=str(tmp_path))
    proc = start_run_server(tmp_path / "run-server.log", **env)
    try:
        wait_run_server(proc)
        descendants = children_of(proc.popen.pid)
        os.kill(proc.popen.pid, signal.SIGTERM)
        time.sleep(0.3)  # while it waits for the API to drain
        os.kill(proc.popen.pid, signal.SIGTERM)
        code = proc.popen.wait(timeout=60)
    finally:
        proc.stop(timeout_s=60)
    deadline = time.monotonic() + 30
    while (left := [p for p in descendants if Path(f"/proc/{p}").exists()]) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in left:  # a tier left running (serving is in a session of its own): not into the next test
        os.kill(pid, signal.SIGKILL)
    assert code == 0 and not left, f"left running: {left}\n{proc.log()}"
    assert not list(tmp_path.glob("serving-sockets.*"))


WATCH_S = 6.0  # how long a waiting run-server is watched
FRAUD_ONLY = 'model_config_list { config { name: "fraud" base_path: "/models/fraud" model_platform: "tensorflow" } }'


def run_server(tmp_path: Path, **overrides: str) -> Process:
    """run-server.sh with `one_worker_env(**overrides)`, its output in tmp_path/run-server.log."""
    return start_run_server(tmp_path / "run-server.log", **one_worker_env(**overrides))


def one_worker_env(**overrides: str) -> dict[str, str]:
    """run-server.sh on free loopback ports with this checkout's models and one API worker."""
    return run_server_env(**{"WEB_CONCURRENCY": "1", **overrides})


def test_a_one_line_config_of_one_model_serves_that_route(tmp_path: Path) -> None:
    # The config parsed as the text format it is (one line is fine), waited for by its own
    # model names; only the route whose model it has is enabled.
    config = tmp_path / "fraud-only.config"
    config.write_text(FRAUD_ONLY)
    env = one_worker_env(MODEL_CONFIG_FILE=str(config), MODEL_ROUTES="examples.fraud.route:route")
    proc = start_run_server(tmp_path / "run-server.log", **env)
    api = f"http://127.0.0.1:{env['API_PORT']}"
    try:
        wait_run_server(proc)
        assert "model 'fraud' AVAILABLE" in proc.log() and "digits" not in proc.log()
        ready = httpx.get(api + "/readyz", timeout=10).json()
        assert ready["status"] == "ready" and list(ready["models"]) == ["fraud"]
    finally:
        assert proc.stop(timeout_s=60) == 0, proc.log()


def serving_predicts(metrics_url: str, model: str) -> int:
    """`:tensorflow:serving:request_count` of `model`, every status: its Predicts so far."""
    page = httpx.get(metrics_url, timeout=10).text
    total = 0
    for line in page.splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith(":tensorflow:serving:request_count{") and f'model_name="{model}"' in name:
            total += int(float(value))
    return total


def test_what_run_server_starts_coalesces_concurrent_scores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No API setting given: concurrent scores reach serving as fewer Predicts than requests
    (coalescing is on by default), counted by serving's own request counter."""
    for name in [n for n in os.environ if n.startswith("COALESCING_")]:
        monkeypatch.delenv(name)  # the default, whatever this shell has set
    config = tmp_path / "fraud-only.config"
    config.write_text(FRAUD_ONLY)
    monitoring = tmp_path / "monitoring.config"
    monitoring.write_text('prometheus_config { enable: true path: "/monitoring/prometheus/metrics" }\n')
    env = one_worker_env(
        MODEL_CONFIG_FILE=str(config),
        MODEL_ROUTES="examples.fraud.route:route",
        SERVING_ARGS=f"--rest_api_host=127.0.0.1 --monitoring_config_file={monitoring}",
    )
    proc = start_run_server(tmp_path / "run-server.log", **env)
    metrics = f"http://127.0.0.1:{env['REST_API_PORT']}/monitoring/prometheus/metrics"
    bodies = transactions(64, seed=21)
    try:
        wait_run_server(proc)
        before = serving_predicts(metrics, "fraud")
        run = run_load(f"http://127.0.0.1:{env['API_PORT']}/v1/fraud/score", bodies, concurrency=32, max_seconds=60)
        predicts = serving_predicts(metrics, "fraud") - before
    finally:
        assert proc.stop(timeout_s=60) == 0, proc.log()
    assert run.statuses() == {200: len(bodies)}, [o.body for o in run.outcomes if o.status != 200][:3]
    for outcome in run.outcomes:  # (coalesced scores equal plain ones: tests/api/test_transport_real_serving.py)
        assert outcome.body["transaction_id"] == bodies[outcome.index]["transaction_id"]
        assert 0.0 <= outcome.body["fraud_score"] <= 1.0
    assert 0 < predicts < len(bodies), f"{predicts} Predicts at serving for {len(bodies)} scores"


def last_line(log: str) -> str:
    return log.rstrip().splitlines()[-1]


def test_an_enabled_route_whose_model_serving_lacks_stops_the_api_at_once(tmp_path: Path) -> None:
    config = tmp_path / "fraud-only.config"
    config.write_text(FRAUD_ONLY)
    proc = run_server(tmp_path, MODEL_CONFIG_FILE=str(config))
    try:
        assert proc.popen.wait(180) != 0  # digits is enabled by default; its model is not there
    finally:
        proc.stop()
    # The reason is the last line printed, after the tiers' own shutdown lines, with the models
    # serving's config names and the fix.
    last = last_line(proc.log(tail_chars=None))
    assert last.startswith("run-server: API exited before it was ready: serving does not have the model"), last
    assert "route 'digits' calls model 'digits'" in last and "Serving's model config names: fraud." in last
    assert last.endswith("or leave the route out of MODEL_ROUTES.")


def test_a_route_that_does_not_fit_its_models_signature_stops_the_api_at_once(tmp_path: Path) -> None:
    """A signature the model does not have: the API does not start, and the last line says why
    and what to do (it used to start and answer 502 while run-server waited)."""
    config = tmp_path / "fraud-only.config"
    config.write_text(FRAUD_ONLY)
    proc = run_server(
        tmp_path,
        MODEL_CONFIG_FILE=str(config),
        MODEL_ROUTES="examples.fraud.route:route",
        MODELS__FRAUD__SIGNATURE_NAME="scores",
    )
    try:
        assert proc.popen.wait(180) == 1
    finally:
        proc.stop()
    last = last_line(proc.log(tail_chars=None))
    assert last.startswith(
        "run-server: API exited before it was ready: route 'fraud' does not fit model 'fraud' version 1, "
        "signature 'scores': version 1 has no signature 'scores' (it has: __saved_model_init_op, serving_default). "
        "Fix: "
    ), last
    assert "API ready on" not in proc.log(tail_chars=None)


def test_a_route_module_that_does_not_import_says_to_check_pythonpath_last(tmp_path: Path) -> None:
    proc = run_server(tmp_path, MODEL_ROUTES="my_routes.iris:route", PYTHONPATH=str(tmp_path / "nowhere"))
    try:
        assert proc.popen.wait(180) == 1
    finally:
        proc.stop()
    log = proc.log(tail_chars=None)
    assert last_line(log) == (
        "run-server: API exited before it was ready: MODEL_ROUTES: cannot import 'my_routes.iris:route': no module "
        f"'my_routes' on the Python path (PYTHONPATH is '{tmp_path / 'nowhere'}'). Fix: add the folder that holds "
        "'my_routes' to PYTHONPATH."
    )
    assert "Traceback" not in log  # nothing of the user's ran: no traceback to read


def test_while_the_api_is_not_ready_run_server_says_why_once_and_polls_quietly(tmp_path: Path) -> None:
    """Serving unreachable from the API (a SERVING_URL nothing listens on): the API starts,
    /readyz is 503 with the reason, and run-server prints that reason once while it waits,
    without an access-log line of its own every fraction of a second."""
    config = tmp_path / "fraud-only.config"
    config.write_text(FRAUD_ONLY)
    proc = run_server(
        tmp_path,
        MODEL_CONFIG_FILE=str(config),
        MODEL_ROUTES="examples.fraud.route:route",
        SERVING_URL=f"http://127.0.0.1:{free_port()}",
    )
    reason = "run-server: API not ready yet: not ready: fraud: "
    try:
        wait_until(lambda: reason in proc.log() or not proc.alive(), 180, "run-server to say why")
        assert proc.alive(), proc.log()
        (said,) = [line for line in proc.log().splitlines() if reason in line]
        assert "connection refused" in said, said  # what the readiness check met, e.g. "model metadata: ..."
        polls_before = proc.log_path.read_text().count("GET /readyz 503")
        time.sleep(WATCH_S)
        log = proc.log_path.read_text()
    finally:
        assert proc.stop(timeout_s=60) == 0, proc.log()
    assert log.count("run-server: API not ready yet") == 1, log
    polls = log.count("GET /readyz 503") - polls_before
    assert polls <= WATCH_S / 2 + 1, f"{polls} readiness polls in {WATCH_S} s"  # one per 2 s at most
    assert "API ready on" not in log


def test_run_server_refuses_a_config_that_does_not_parse(tmp_path: Path) -> None:
    config = tmp_path / "broken.config"
    config.write_text('model_config_list { config { nam: "fraud" } }')
    proc = run_server(tmp_path, MODEL_CONFIG_FILE=str(config))
    assert proc.popen.wait(30) == 2
    assert 'no field named "nam"' in proc.log()


def test_run_server_fails_fast_on_a_missing_config(tmp_path: Path) -> None:
    env = {"MODEL_CONFIG_FILE": str(tmp_path / "nope.config"), "PYTHON": sys.executable}
    proc = start_run_server(tmp_path / "log", **env)
    assert proc.popen.wait(30) != 0
    assert "not found" in proc.log()


@pytest.mark.parametrize("busy_one", ["API_PORT", "API_OPS_BIND"])
def test_run_server_refuses_a_port_in_use(tmp_path: Path, busy_one: str) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = {
            "MODELS_DIR": str(REPO / "models"),
            "PYTHON": sys.executable,
            "API_PORT": str(free_port()),
            "API_OPS_BIND": f"127.0.0.1:{free_port()}",
            "REST_API_PORT": str(free_port()),
            "GRPC_PORT": str(free_port()),
        }
        # The operational port (/docs, /metrics) bound by another instance failed to bind
        # here, and the "API ready" line pointed at that instance's.
        env[busy_one] = str(port) if busy_one == "API_PORT" else f"127.0.0.1:{port}"
        proc = start_run_server(tmp_path / "log", **env)
        assert proc.popen.wait(30) == 1
    assert f"port {port} is already in use" in proc.log()


def listening_addresses(port: int) -> set[str]:
    """The addresses something listens on at `port` (/proc/net/tcp and tcp6; IPv4-mapped as IPv4)."""
    found = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            hex_address, hex_port = local.split(":")
            if state != "0A" or int(hex_port, 16) != port:  # 0A: LISTEN
                continue
            # Each 32-bit word is in host (little-endian) order.
            raw = b"".join(bytes.fromhex(hex_address[i : i + 8])[::-1] for i in range(0, len(hex_address), 8))
            address = ipaddress.ip_address(raw)
            mapped = getattr(address, "ipv4_mapped", None)
            found.add(str(mapped or address))
    return found


def serving_pid_of(run_server_pid: int) -> int:
    for pid in children_of(run_server_pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serving" in cmdline and b"-m" in cmdline:
            return pid
    raise AssertionError("no serving process")


def test_serving_is_restarted_while_the_api_answers_503_and_gives_up_after_repeated_exits(tmp_path: Path) -> None:
    env = one_worker_env(
        SERVING_MAX_RESTARTS="1",
        REQUEST_TIMEOUT_S="1",
        # The API's, not yet made (gunicorn.conf.py makes it): the model server must not use it.
        PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "prometheus"),
        SERVING_ARGS="",  # serving's bind address is run-server.sh's choice here
    )
    api_port, rest_port, grpc_port = (int(env[k]) for k in ("API_PORT", "REST_API_PORT", "GRPC_PORT"))
    proc = start_run_server(tmp_path / "run-server.log", **env)
    api = f"http://127.0.0.1:{api_port}"
    body = (REPO / "examples" / "transaction.json").read_bytes()

    def score() -> httpx.Response:
        return httpx.post(api + "/v1/fraud/score", content=body, headers={"content-type": "application/json"})

    try:
        wait_run_server(proc)
        # Only the API is reachable from outside: serving listens on loopback.
        assert listening_addresses(rest_port) == {"127.0.0.1"}
        assert listening_addresses(grpc_port) == {"127.0.0.1"}
        assert listening_addresses(api_port) == {"127.0.0.1"}

        first = serving_pid_of(proc.popen.pid)
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: not process_running(first), 10, "serving to die")
        down = score()
        assert down.status_code == 503 and down.json()["code"] == "serving_unavailable", down.text
        assert httpx.get(api + "/readyz", timeout=5).status_code == 503
        # Restarted after its backoff; the API recovers without a restart of its own.
        wait_until(lambda: http_ok(api + "/readyz"), 120, "serving restarted and ready")
        assert score().status_code == 200
        assert proc.alive()
        assert "restarting it in 1s" in proc.log_path.read_text()

        # A second exit within the window is one more than SERVING_MAX_RESTARTS: give up.
        os.kill(serving_pid_of(proc.popen.pid), signal.SIGKILL)
        assert proc.popen.wait(60) == 1, proc.log()
        assert "giving up" in proc.log_path.read_text()
        assert not http_ok(api + "/healthz")
    finally:
        proc.stop(timeout_s=60)


@pytest.mark.skipif(shutil.which("taskset") is None, reason="taskset not installed")
def test_run_server_sizes_both_tiers_from_its_cpus(tmp_path: Path) -> None:
    """On one CPU (taskset), nothing set but batching: one API worker, one session thread,
    one TensorFlow thread each, one batch thread."""
    # No WEB_CONCURRENCY: run-server.sh sizes the API itself.
    env = run_server_env(SERVING_ARGS="--rest_api_host=127.0.0.1 --enable_batching")
    proc = start_run_server(tmp_path / "run-server.log", prefix=["taskset", "-c", "0"], **env)
    try:
        wait_run_server(proc)
        log = (tmp_path / "run-server.log").read_text(errors="replace")
        assert ("CPU budget: API 1 worker(s); serving --tensorflow_intra_op_parallelism=1 "
                "--tensorflow_inter_op_parallelism=1 --rest_api_num_threads=1") in log
        assert "intra_op_parallelism_threads=1 inter_op_parallelism_threads=1" in log
        assert "num_batch_threads=1" in log
        workers = [p for p in children_of(proc.popen.pid)
                   if "gunicorn" in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")]
        assert len(workers) == 2  # the master and one worker
    finally:
        code = proc.stop(timeout_s=60)
    assert code == 0, proc.log()



def test_api_host_keeps_the_oip_grpc_port_on_its_interface(tmp_path: Path) -> None:
    # API_HOST=127.0.0.1 (run_server_env's): the OIP gRPC port follows it, as the API's does.
    grpc_port = free_port()
    env = one_worker_env(OIP__MODELS="all", OIP__GRPC_PORT=str(grpc_port))
    assert env["API_HOST"] == "127.0.0.1" and "OIP__GRPC_HOST" not in env
    proc = start_run_server(tmp_path / "run-server.log", **env)
    try:
        wait_run_server(proc)
        wait_until(lambda: bool(listening_addresses(grpc_port)), 30.0, "the OIP gRPC port listening")
        assert listening_addresses(grpc_port) == {"127.0.0.1"}, proc.log()
        assert listening_addresses(int(env["API_PORT"])) == {"127.0.0.1"}
    finally:
        assert proc.stop(timeout_s=60) == 0, proc.log()


@pytest.mark.parametrize(
    "signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["sigint", "sigterm", "sighup"]
)
def test_a_signal_to_the_whole_group_drains_requests_in_flight(tmp_path: Path, signum: int) -> None:
    """Ctrl-C (SIGINT), a closed terminal (SIGHUP) or `kill -- -PGID` reaches run-server.sh's
    whole process group at once: the tiers do not hear it, run-server.sh stops the API first
    (gunicorn drains) and then serving, so every request sent before the signal is answered 200."""
    env = one_worker_env(TMPDIR=str(tmp_path))
    proc = start_run_server(tmp_path / "run-server.log", **env)
    url = f"http://127.0.0.1:{env['API_PORT']}/v1/fraud/score"
    bodies = transactions(64, seed=5)
    signalled = threading.Event()
    answered: list[int] = []
    failed: list[str] = []

    async def caller(client: httpx.AsyncClient, n: int) -> None:
        while not signalled.is_set():
            try:
                response = await client.post(url, json=bodies[n % len(bodies)])
            except httpx.HTTPError as error:
                failed.append(repr(error))
            else:
                if response.status_code == 200:
                    answered.append(200)
                else:
                    failed.append(f"{response.status_code} {response.text[:200]}")
            n += len(bodies)

    async def load() -> None:
        async with httpx.AsyncClient(timeout=30.0, limits=httpx.Limits(max_connections=CONCURRENCY)) as client:
            await asyncio.gather(*(caller(client, n) for n in range(CONCURRENCY)))

    loader = threading.Thread(target=asyncio.run, args=(load(),), daemon=True)
    try:
        wait_run_server(proc)
        descendants = children_of(proc.popen.pid)
        loader.start()
        wait_until(lambda: len(answered) >= 2 * CONCURRENCY or bool(failed), 60, "load under way")
        assert not failed, failed[:3]
        # Each caller stops after the answer in flight now: every request counted was sent
        # before the signal.
        signalled.set()
        os.killpg(proc.popen.pid, signum)
        code = proc.popen.wait(90)
        loader.join(60)
    finally:
        signalled.set()
        proc.stop(timeout_s=60)
    assert not loader.is_alive()
    assert not failed, (len(failed), failed[:5], proc.log())
    assert code == 0, proc.log()
    log = proc.log(None)
    assert "run-server: stopping" in log
    # The ordered stop: gunicorn's master finished draining before serving stopped.
    assert log.index("Shutting down: Master") < log.rindex("Server stopped"), log[-3000:]
    alive = [p for p in descendants if process_running(p)]
    assert not alive, f"left running: {alive}"


CONCURRENCY = 50  # requests kept in flight while the group is signalled
