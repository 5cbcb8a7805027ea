"""The setups under comparison, and how each is started on 127.0.0.1.

| setup | processes | handler | model |
| --- | --- | --- | --- |
| `naive` | gunicorn, 3 workers, no preload | `async def` | Keras `predict`, every worker |
| `tuned` | gunicorn, workers = cores, preload | `def` | Session callable per worker |
| `split` | `./run-server.sh`, nothing set: serving + the API | `async def` | in serving only |
| `split-*` | the same with one setting changed (a variant) | `async def` | in serving only |
| `ceiling` | the API's gunicorn (`gunicorn.conf.py`), workers = cores | the API's own | none: answered in-process |
| `bentoml` (peer) | `bentoml serve`, own venv, 1 worker | `@bentoml.api(batchable=True)` | in-process, batched |
| `ray-serve` (peer) | local Ray + Serve, own venv, 1 replica | FastAPI + `@serve.batch` | in the replica, batched |

`split` is the product's default, the one the headline measures: exactly what
`run-server.sh` (and `make run`) starts without extra settings, which sizes both tiers from
the CPUs it may use (see `api.ops.cpu_budget.one_container_budget`). The benchmark only
gives it free ports, loopback, a score-event file in the run folder and a model config
naming the workload's model alone (the in-process setups load that one model too), so the
API serves the fraud route only (`MODEL_ROUTES`), with that model
(`MODELS__FRAUD__MODEL_NAME` for a model not named fraud). Variants set one more API setting
each (coalescing, gRPC towards serving); `split_variants` reads `api.config.settings` at run
time and says which the API cannot express.

The ceiling is the product's API itself (`bench.apps.ceiling`: the same app factory,
middleware, route, gunicorn settings and HTTP server as the split's API) with a serving
client that answers without a model, so the split can be no faster.

The peers (`bench.peers`: what a user would pick instead) are installed by the benchmark
into venvs of their own, pinned, and run the same SavedModel and feature code.

Every server process runs under `taskset -c <server CPUs>`, so all setups get the same CPU
budget (and `run-server.sh` sees that budget as its affinity) and the load generator keeps
its own CPU.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.peers import PEERS, PeerInstallError, ensure_installed
from bench.processes import REPO, Probe, SetupError, log_count, taskset
from bench.procfs import all_stats, cmdline, process_tree
from bench.workload import FRAUD, Workload
from tools.processes import Process, free_port, gunicorn_command, run_server_command, wait_until

SCORE_PATH = "/v1/fraud/score"
NAIVE_WORKERS = 3
# uvicorn logs this once per worker when its lifespan startup has finished.
STARTUP_COMPLETE = "Application startup complete"
# run-server.sh prints this once the API answers /readyz.
RUN_SERVER_READY = "API ready on"
READY_TIMEOUT_S = 240.0  # naive: every worker imports TensorFlow + Keras on a shared core
PROBE_TIMEOUT_S = 30.0  # from "ready" to a 2xx score
# The in-process apps' gunicorn settings (not ./gunicorn.conf.py, which is the API's: only
# the ceiling, which is the API, runs with that).
INPROCESS_GUNICORN_CONF = REPO / "bench" / "apps" / "gunicorn_conf.py"
API_GUNICORN_CONF = REPO / "gunicorn.conf.py"
# The API settings (api.config.settings) that enable routes and name the model behind the fraud route.
MODEL_ROUTES_ENV = "MODEL_ROUTES"
FRAUD_ROUTE = "examples.fraud.route:route"
FRAUD_MODEL_ENV = "MODELS__FRAUD__MODEL_NAME"

# Environment of every server process: quiet TensorFlow C++ logs.
_BASE_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
# One thread per pool in the tuned app's workers: workers = cores, one thread each.
_ONE_THREAD_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "TF_NUM_INTRAOP_THREADS": "1",
    "TF_NUM_INTEROP_THREADS": "1",
}


@dataclass(frozen=True)
class Setup:
    """One setup under comparison.

    `column` is its family in the tables (naive | tuned | split | ceiling | peer); of the split
    setups the `headline` one is the product's default, the others are variants.
    """

    name: str
    column: str
    description: str
    kind: str  # "inprocess" (one gunicorn app), "split" (run-server.sh) or "peer" (bench.peers)
    app: str = ""  # gunicorn app spec for kind "inprocess"
    gunicorn_conf: Path = INPROCESS_GUNICORN_CONF  # kind "inprocess": gunicorn's -c
    preload: bool = False
    fixed_workers: int | None = None  # None: one worker per server CPU (in-process)
    env: Mapping[str, str] = field(default_factory=dict)
    headline: bool = False
    available: bool = True
    unavailable_reason: str = ""
    peer: str = ""  # kind "peer": its name in bench.peers.PEERS
    # The request body as this setup takes it: "" the route's Transaction as is; a field name
    # F: {"F": [<Transaction>]} (a BentoML batchable API takes one list parameter).
    body_field: str = ""
    # Seconds a start takes until ready, about: (fixed, per worker). What the runner's time
    # budget sets aside for the starts still to come (bench.runner.Budget). Measured on a
    # 2-core Intel Xeon (AVX-512, 2026-12-07), one server CPU: tuned 7 s with 1 or 4
    # workers (--preload, the workers fork); naive 6 s at 1, 18 s at 3, 27 s at 4 (each
    # worker imports TensorFlow and Keras); the split 6-9 s at 1 or 4 (19 s for the heavier
    # model: serving's warm-up); BentoML 10 s at 1, 17 s for the heavier model, 26 s at 4;
    # Ray Serve 19-33 s at 1 replica, 42-53 s at 4 (its local cluster first).
    start_s: tuple[float, float] = (10.0, 0.5)

    def start_estimate_s(self, workers: int) -> float:
        """Seconds a start with `workers` workers takes until ready, about (`start_s`)."""
        fixed, per_worker = self.start_s
        return fixed + per_worker * max(1, workers)

    def workers_for(self, server_cores: int) -> int | None:
        """In-process worker count on `server_cores` CPUs; None for a split setup, whose
        run-server.sh sizes its API itself; 1 for a peer (BentoML workers, Serve replicas)."""
        if self.kind == "split":
            return None
        if self.kind == "peer":
            return self.fixed_workers or 1
        return self.fixed_workers if self.fixed_workers is not None else max(1, server_cores)


NAIVE = Setup(
    name="naive",
    column="naive",
    description="3 gunicorn uvicorn workers, no --preload, async def + Keras model.predict "
    "in every worker",
    kind="inprocess",
    app="bench.apps.naive:create_app()",
    fixed_workers=NAIVE_WORKERS,
    start_s=(2.0, 6.5),
)
TUNED = Setup(
    name="tuned",
    column="tuned",
    description="workers = cores, --preload of the imports, def handler + Session "
    "make_callable created per worker after fork, 1 TF/OMP thread",
    kind="inprocess",
    app="bench.apps.tuned:create_app()",
    preload=True,
    env=_ONE_THREAD_ENV,
)
CEILING = Setup(
    name="ceiling",
    column="ceiling",
    description="the split's API itself (app, middleware, gunicorn.conf.py, its HTTP server), "
    "workers = cores, every predict answered in-process without a model",
    kind="inprocess",
    app="bench.apps.ceiling:create_app()",
    gunicorn_conf=API_GUNICORN_CONF,
    preload=True,
    env=_ONE_THREAD_ENV,
)


# --- the split and its variants, from the API's settings ------------------------------


def _is_bool(annotation: Any) -> bool:
    if annotation is bool:
        return True
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return bool in typing.get_args(annotation)
    return False


def _literal_values(annotation: Any) -> tuple[Any, ...]:
    if typing.get_origin(annotation) is typing.Literal:
        return typing.get_args(annotation)
    return ()


def split_variants(fields: Mapping[str, Any]) -> list[Setup]:
    """The split setups: the product default and the variants the API's settings allow.

    Args:
        fields: `api.config.settings.Settings.model_fields` (name -> pydantic FieldInfo, whose
            `.annotation` is the field's type and `.default` its default).

    Returns:
        `split` (the default, `headline`), then the coalescing variant (a boolean field
        with "coalesc" in its name set to the opposite of its default: `split-coalescing`
        when the default is off, `split-no-coalescing` when it is on), `split-grpc`
        (`serving_protocol` set to "grpc") and gRPC with the coalescing variant's setting.
        A variant the settings cannot express is returned with `available=False` and the
        reason, so the report can say "not available yet".
    """
    protocol = fields.get("serving_protocol")
    grpc_reason = ""
    if protocol is None:
        grpc_reason = "not available yet: api.config.settings has no serving_protocol field"
    elif (values := _literal_values(protocol.annotation)) and "grpc" not in values:
        grpc_reason = f"not available yet: serving_protocol accepts only {values}"
    coalescing = sorted(
        name for name, info in fields.items() if "coalesc" in name and _is_bool(info.annotation)
    )
    coalescing_reason = (
        "" if coalescing else "not available yet: api.config.settings has no boolean coalescing field"
    )
    coalescing_on_by_default = bool(coalescing) and getattr(fields[coalescing[0]], "default", None) is True
    toggled = "no-coalescing" if coalescing_on_by_default else "coalescing"
    variants = [
        Setup(
            name="split",
            column="split",
            description="./run-server.sh with nothing set (the product default): python -m "
            "serving + the API, both sized from the CPU budget, REST over a Unix-domain socket between them",
            kind="split",
            headline=True,
        )
    ]
    for grpc, coalesce in ((False, True), (True, False), (True, True)):
        env: dict[str, str] = {}
        if grpc:
            env["SERVING_PROTOCOL"] = "grpc"
        if coalesce and coalescing:
            env[coalescing[0].upper()] = "false" if coalescing_on_by_default else "true"
        reason = (grpc_reason if grpc else "") or (coalescing_reason if coalesce else "")
        name = "split" + ("-grpc" if grpc else "") + (f"-{toggled}" if coalesce else "")
        changed = " and ".join(f"{k}={v}" for k, v in env.items()) or "(not expressible)"
        variants.append(
            Setup(
                name=name,
                column="split",
                description=f"the split with {changed} (a variant)",
                kind="split",
                env=env,
                available=not reason,
                unavailable_reason=reason,
            )
        )
    return variants


def custom_variant(settings: Mapping[str, str]) -> Setup:
    """A split variant with `settings` (environment variables of run-server.sh: API settings,
    `SERVING_ARGS`, `WEB_CONCURRENCY`...) set, named after them: `split+NAME=VALUE,...`.

    Raises:
        ValueError: no settings, or a name that is not an environment variable name.
    """
    if not settings:
        raise ValueError("a variant needs at least one NAME=VALUE setting")
    for name in settings:
        if not name.replace("_", "").isalnum() or not name[0].isalpha():
            raise ValueError(f"not an environment variable name: {name!r}")
    changed = ",".join(f"{k}={v}" for k, v in settings.items())
    return Setup(
        name=f"split+{changed}",
        column="split",
        description=f"the split with {changed} (a variant)",
        kind="split",
        env=dict(settings),
    )


def api_settings_fields() -> Mapping[str, Any]:
    """`api.config.settings.Settings.model_fields` of the API in this checkout."""
    from api.config.settings import Settings

    return Settings.model_fields


BENTOML = Setup(
    name="bentoml",
    column="peer",
    description="BentoML 1.4 (own venv): one @bentoml.service, @bentoml.api(batchable=True) "
    "adaptive batching, the SavedModel and feature code in-process, 1 worker",
    kind="peer",
    peer="bentoml",
    body_field="transactions",
    start_s=(12.0, 4.0),
)
RAY_SERVE = Setup(
    name="ray-serve",
    column="peer",
    description="Ray Serve 2.60 (own venv): one deployment, FastAPI ingress, @serve.batch, "
    "the SavedModel and feature code in the replica, 1 replica",
    kind="peer",
    peer="ray-serve",
    start_s=(20.0, 8.0),
)


def all_setups() -> list[Setup]:
    """Every setup in run order: tuned first (each workload's SLO is derived from it, and
    the targets compare with its SLO-RPS), ceiling, naive, the split and its variants, then
    the peers."""
    from bench.rollout_setups import ROLLOUT_SETUPS  # it imports Setup from here

    return [TUNED, CEILING, NAIVE, *split_variants(api_settings_fields()), *ROLLOUT_SETUPS, BENTOML, RAY_SERVE]


# --- running a setup -------------------------------------------------------------------


def _role(pid: int, parent_cmd: str, cmd: str, split: bool) -> str:
    if "_bentoml_impl.worker" in cmd:
        return "bentoml worker"
    if "ServeReplica" in cmd:
        return "ray-serve replica worker"
    if "bentoml" in cmd:
        return "bentoml"
    if cmd.startswith("ray::") or "/ray/" in cmd or "ray_serve_app" in cmd:
        return "ray " + (cmd.split()[0].rsplit("/", 1)[-1] if cmd else str(pid))[:40]
    if "-m serving" in cmd or "tensorflow_model_server" in cmd:
        return "serving"
    if "gunicorn" in cmd:
        name = "api" if split else "gunicorn"
        return f"{name} worker" if "gunicorn" in parent_cmd else name
    if "run-server.sh" in cmd:
        return "run-server"
    return cmd[:60] or str(pid)


def is_worker(role: str) -> bool:
    """Whether a process of role `role` (`RunningSetup.roles`) is a worker: an API or in-process
    app worker, a BentoML worker or a Ray Serve replica."""
    return role.endswith("worker")


class RunningSetup:
    """A started setup: its root process, its URL, its process tree. Stop with `stop()`."""

    def __init__(self, setup: Setup, workload: Workload, url: str, root: Process) -> None:
        self.setup = setup
        self.workload = workload
        self.url = url
        self.root = root
        self._seen: set[int] = set()  # every pid of the tree seen, for stop()

    def pids(self) -> list[int]:
        """Every live process of the setup (the root and all it started)."""
        pids = process_tree([self.root.pid])
        self._seen.update(pids)
        return pids

    def roles(self) -> dict[int, str]:
        """pid -> role: "serving", "api", "api worker", "run-server", "gunicorn", ..."""
        stats = {s.pid: s for s in all_stats()}
        roles = {}
        for pid in process_tree([self.root.pid], stats.values()):
            parent = stats[pid].ppid if pid in stats else 0
            roles[pid] = _role(pid, cmdline(parent), cmdline(pid), self.setup.kind == "split")
        return roles

    @property
    def workers(self) -> int:
        """API (or in-process app) worker processes running now."""
        return sum(1 for role in self.roles().values() if is_worker(role))

    def commands(self) -> list[str]:
        """The command line that was started, for the report."""
        return [" ".join(self.root.args)]

    def stop(self) -> None:
        """Stop the setup (run-server.sh stops the API before serving); then end whatever
        of its tree outlived its root (Ray's actors run in sessions of their own, so the
        root's process group does not hold them)."""
        self.pids()
        self.root.stop()
        for pid in sorted(self._seen - {self.root.pid}):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def __enter__(self) -> RunningSetup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class NotAvailable(SetupError):
    """The setup cannot run with the code in this checkout yet (reported as skipped)."""


def _wait_scored(proc: Process, url: str, probe: bytes, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    scored = Probe(url, probe)
    try:
        wait_until(
            scored,
            timeout_s=timeout_s,
            what=f"{proc.name} to score a transaction",
            watch=[proc],
            poll_s=0.25,
        )
    except SetupError as exc:
        raise SetupError(
            f"{proc.name} did not score a transaction: last answer {scored.last}\n{exc}"
        ) from None


def _start_inprocess(
    setup: Setup, workload: Workload, workers: int, cpus: tuple[int, ...], run_dir: Path,
    probe: bytes,
) -> RunningSetup:
    port = free_port()
    url = f"http://127.0.0.1:{port}{SCORE_PATH}"
    options = [f"--workers={workers}", f"--bind=127.0.0.1:{port}", *(["--preload"] if setup.preload else [])]
    proc = Process(
        [*taskset(cpus), *gunicorn_command(*options, config=str(setup.gunicorn_conf), app=setup.app)],
        run_dir / f"{workload.name}-{setup.name}-w{workers}.log",
        name="gunicorn",
        env={
            **_BASE_ENV,
            **setup.env,
            "BENCH_MODEL_DIR": str(workload.version_dir),
            # The ceiling is the API: its score events go to the run folder, as the split's.
            "EVENTS_JSONL_PATH": str(run_dir / f"{workload.name}-{setup.name}-score-events.jsonl"),
        },
    )
    try:
        wait_until(
            lambda: log_count(proc, STARTUP_COMPLETE) >= workers,
            timeout_s=READY_TIMEOUT_S,
            what=f"{workers} worker(s) of {setup.name} to finish startup",
            watch=[proc],
            poll_s=0.25,
        )
        _wait_scored(proc, url, probe)
    except BaseException:
        proc.stop()
        raise
    return RunningSetup(setup, workload, url, proc)


def split_environment(
    workload: Workload, *, api_port: int, rest_port: int, grpc_port: int, run_dir: Path,
    tag: str,
) -> dict[str, str]:
    """What the benchmark sets for `run-server.sh` beyond the setup's own settings: ports
    on loopback, the interpreter, the score-event file and a model config with the
    workload's model. Nothing that sizes or tunes either tier."""
    env = {
        **_BASE_ENV,
        "PYTHON": sys.executable,
        "API_HOST": "127.0.0.1",
        "API_PORT": str(api_port),
        "REST_API_PORT": str(rest_port),
        "GRPC_PORT": str(grpc_port),
        "EVENTS_JSONL_PATH": str(run_dir / f"{tag}-score-events.jsonl"),
    }
    # The workload's model alone, in models.config's format (run-server.sh reads the names
    # line by line), as the in-process setups load it: the product's models.config would add
    # the digits CNN and its memory to the split's total only.
    config = run_dir / f"models-{workload.model_name}.config"
    config.write_text(
        "model_config_list {\n  config {\n"
        f'    name: "{workload.model_name}"\n'
        f'    base_path: "{workload.base_path}"\n'
        '    model_platform: "tensorflow"\n  }\n}\n'
    )
    env["MODEL_CONFIG_FILE"] = str(config)
    # Serving has that model alone: the API serves the fraud route only (it refuses to start
    # with a route whose model serving does not have).
    env[MODEL_ROUTES_ENV] = FRAUD_ROUTE
    if workload.model_name != FRAUD.model_name:
        env[FRAUD_MODEL_ENV] = workload.model_name
    return env


def _start_split(
    setup: Setup, workload: Workload, workers: int | None, cpus: tuple[int, ...],
    run_dir: Path, probe: bytes,
) -> RunningSetup:
    api_port = free_port()
    # A file name: a custom variant's name may hold any character its settings do.
    tag = re.sub(r"[^\w.+=-]", "_", f"{workload.name}-{setup.name}") + (
        f"-w{workers}" if workers else ""
    )
    env = split_environment(
        workload, api_port=api_port, rest_port=free_port(), grpc_port=free_port(),
        run_dir=run_dir, tag=tag,
    )
    env.update(setup.env)
    if workers is not None:  # memory at a given API worker count
        env["WEB_CONCURRENCY"] = str(workers)
    url = f"http://127.0.0.1:{api_port}{SCORE_PATH}"
    proc = Process([*taskset(cpus), *run_server_command()], run_dir / f"{tag}.log", name="run-server", env=env)
    try:
        wait_until(
            lambda: log_count(proc, RUN_SERVER_READY) >= 1,
            timeout_s=READY_TIMEOUT_S,
            what=f"run-server.sh ({setup.name}) to report the API ready",
            watch=[proc],
            poll_s=0.25,
        )
        _wait_scored(proc, url, probe)
    except BaseException:
        proc.stop()
        raise
    return RunningSetup(setup, workload, url, proc)


def wrap_body(body: bytes, field_name: str) -> bytes:
    """`body` (one JSON document) as `{"<field_name>": [body]}`; unchanged for no field."""
    if not field_name:
        return body
    return b'{"' + field_name.encode() + b'":[' + body + b"]}"


def _start_peer(
    setup: Setup, workload: Workload, workers: int, cpus: tuple[int, ...], run_dir: Path,
    probe: bytes, slo_ms: float,
) -> RunningSetup:
    peer = PEERS[setup.peer]
    try:
        ensure_installed(peer)
    except PeerInstallError as exc:
        raise NotAvailable(f"cannot be installed here: {exc}") from None
    port = free_port()
    url = f"http://127.0.0.1:{port}{SCORE_PATH}"
    if setup.peer == "bentoml":
        args = [str(peer.venv / "bin" / "bentoml"), "serve", "bench.peers.bentoml_service:FraudScorer",
                "--host", "127.0.0.1", "--port", str(port)]
    else:
        args = [str(peer.python), "-m", "bench.peers.ray_serve_app"]
    proc = Process(
        [*taskset(cpus), *args],
        run_dir / f"{workload.name}-{setup.name}-w{workers}.log",
        name=setup.name,
        env={
            **_BASE_ENV,
            **_ONE_THREAD_ENV,
            "PYTHONPATH": str(REPO),
            "BENCH_MODEL_DIR": str(workload.version_dir),
            "BENCH_WORKERS": str(workers),
            "BENCH_CPUS": str(len(cpus) or os.cpu_count() or 1),
            "BENCH_PORT": str(port),
            "BENCH_SLO_MS": f"{slo_ms:g}",
            # No usage reports (the machine reaches no one), state kept beside the venvs.
            "BENTOML_DO_NOT_TRACK": "True",
            "BENTOML_HOME": str(peer.venv.parent / "bentoml-home"),
            "RAY_USAGE_STATS_ENABLED": "0",
        },
    )
    try:
        _wait_scored(proc, url, wrap_body(probe, setup.body_field), timeout_s=READY_TIMEOUT_S)
    except BaseException:
        proc.stop()
        raise
    return RunningSetup(setup, workload, url, proc)


def start(
    setup: Setup,
    workload: Workload,
    *,
    cpus: tuple[int, ...],
    run_dir: Path,
    probe: bytes,
    workers: int | None = None,
    slo_ms: float = 25.0,
) -> RunningSetup:
    """Start `setup` serving `workload` pinned to `cpus`; return when it is ready.

    Ready means: every worker has finished its lifespan startup (run-server.sh: the API
    answers /readyz) and a real transaction (`probe`) is scored 2xx. `workers` sets the
    in-process worker count (default `setup.workers_for(len(cpus))`), or for a split the
    API's `WEB_CONCURRENCY` (default: unset, run-server.sh sizes it), or a peer's
    workers / replicas (default 1). `slo_ms` is the workload's SLO, which a peer's batcher
    is given as its latency bound (a user sets theirs so).

    Raises:
        NotAvailable: the setup needs an API setting this checkout does not have yet.
        SetupError: a process exited or did not become ready in time (it is stopped).
    """
    if not setup.available:
        raise NotAvailable(setup.unavailable_reason)
    if setup.kind == "split":
        return _start_split(setup, workload, workers, cpus, run_dir, probe)
    if setup.kind == "peer":
        return _start_peer(setup, workload, workers or 1, cpus, run_dir, probe, slo_ms)
    count = workers if workers is not None else setup.workers_for(len(cpus) or 1)
    assert count is not None
    return _start_inprocess(setup, workload, count, cpus, run_dir, probe)
