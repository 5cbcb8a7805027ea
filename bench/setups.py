"""The setups under comparison, and how each is started on 127.0.0.1.

| setup | processes | handler | model |
| --- | --- | --- | --- |
| `naive` | gunicorn, 3 workers, no preload | `async def` | Keras `predict`, every worker |
| `tuned` | gunicorn, workers = cores, preload | `def` | Session callable per worker |
| `split-*` | `python -m serving` + the API | `async def` | in serving only |
| `ceiling` | gunicorn, workers = cores, preload | `async def` | none |

(tuned: one TF/OMP thread per worker; split: the API is `api.app:create_app` under the
project's own `gunicorn.conf.py`.)

The split comes in variants (REST or gRPC towards serving, API-side coalescing on or
off) when the API's settings have the fields for them; `split_variants` reads
`api.settings.Settings` at run time and says which are not available yet.

Every server process is started under `taskset -c <server CPUs>`, so all setups get
the same CPU budget and the load generator keeps its own CPU.
"""

from __future__ import annotations

import socket
import sys
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.processes import (
    REPO,
    Probe,
    Process,
    SetupError,
    free_port,
    get_contains,
    log_count,
    wait_until,
)
from bench.procfs import process_tree

SCORE_PATH = "/v1/fraud/score"
MODEL_NAME = "fraud"
NAIVE_WORKERS = 3
# uvicorn logs this once per worker when its lifespan startup has finished.
STARTUP_COMPLETE = "Application startup complete"
READY_TIMEOUT_S = 240.0  # naive: every worker imports TensorFlow + Keras on a shared core
PROBE_TIMEOUT_S = 30.0  # from "all workers started" to a 2xx score
GRPC_LISTEN_TIMEOUT_S = 5.0  # after REST reports AVAILABLE
# The in-process apps' gunicorn settings (never ./gunicorn.conf.py, which is the API's).
INPROCESS_GUNICORN_CONF = REPO / "bench" / "apps" / "gunicorn_conf.py"

# Environment of every server process: quiet TensorFlow C++ logs.
_BASE_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
# One thread per pool in the tuned app's workers (FACTS.md: workers = cores, 1 thread).
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

    `column` is where it goes in the published table (naive | tuned | split), or
    "ceiling"; several split variants share the "split" column and the best is shown.
    """

    name: str
    column: str
    description: str
    kind: str  # "inprocess" (one gunicorn app) or "split" (serving + API)
    app: str = ""  # gunicorn app spec for kind "inprocess"
    preload: bool = False
    fixed_workers: int | None = None  # None: one worker per server CPU
    env: Mapping[str, str] = field(default_factory=dict)
    # Split only: the API setting naming serving's gRPC address(es), set to the port the
    # benchmark picks, and the one naming the score-event file, set into the run folder.
    grpc_target_env: str = ""
    events_path_env: str = ""
    available: bool = True
    unavailable_reason: str = ""

    def workers_for(self, server_cores: int) -> int:
        """Worker count for the throughput runs on `server_cores` CPUs."""
        return self.fixed_workers if self.fixed_workers is not None else max(1, server_cores)


NAIVE = Setup(
    name="naive",
    column="naive",
    description="3 gunicorn uvicorn workers, no --preload, async def + Keras model.predict "
    "in every worker",
    kind="inprocess",
    app="bench.apps.naive:create_app()",
    fixed_workers=NAIVE_WORKERS,
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
    description="workers = cores, --preload, async def with the same validation and "
    "feature extraction, no model",
    kind="inprocess",
    app="bench.apps.ceiling:create_app()",
    preload=True,
    env=_ONE_THREAD_ENV,
)


# --- split variants, from the API's settings -----------------------------------------


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
    """The split setups the API supports, from its settings' fields.

    Args:
        fields: `api.settings.Settings.model_fields` (name → pydantic FieldInfo, whose
            `.annotation` is the field's type).

    Returns:
        `split-rest` always; `split-grpc` when there is a `serving_protocol` field that
        accepts "grpc" and a field for serving's gRPC target(s); for each protocol a
        `-coalescing` twin with coalescing on when a boolean field with "coalesc" in its
        name exists (the plain variants set it off).
        Variants the settings cannot express are returned with `available=False` and the
        reason, so the report can say "not available yet".
    """
    protocol = fields.get("serving_protocol")
    protocols = ["rest"]
    grpc_reason = ""
    if protocol is None:
        grpc_reason = "not available yet: api.settings has no serving_protocol field"
    else:
        values = _literal_values(protocol.annotation)
        if values and "grpc" not in values:
            grpc_reason = f"not available yet: serving_protocol accepts only {values}"
        else:
            protocols.append("grpc")
    coalescing = sorted(
        name for name, info in fields.items() if "coalesc" in name and _is_bool(info.annotation)
    )
    grpc_targets = sorted(name for name in fields if "grpc" in name and "target" in name)
    if "grpc" in protocols and not grpc_targets:
        protocols.remove("grpc")
        grpc_reason = "not available yet: api.settings has no serving gRPC target field"
    events_path = "events_jsonl_path" if "events_jsonl_path" in fields else ""
    coalescing_reason = (
        ""
        if coalescing
        else "not available yet: api.settings has no boolean coalescing field"
    )

    variants: list[Setup] = []
    for proto in ("rest", "grpc"):
        for coalesce in (False, True):
            name = f"split-{proto}" + ("-coalescing" if coalesce else "")
            env: dict[str, str] = {}
            if protocol is not None:
                env["SERVING_PROTOCOL"] = proto
            if coalescing:
                env[coalescing[0].upper()] = "true" if coalesce else "false"
            reason = (grpc_reason if proto == "grpc" else "") or (
                coalescing_reason if coalesce else ""
            )
            variants.append(
                Setup(
                    name=name,
                    column="split",
                    description=(
                        f"python -m serving + API (gunicorn.conf.py, uvicorn workers = cores) "
                        f"over {proto.upper()}, coalescing {'on' if coalesce else 'off'}"
                    ),
                    kind="split",
                    env=env,
                    grpc_target_env=grpc_targets[0].upper() if grpc_targets else "",
                    events_path_env=events_path.upper(),
                    available=proto in protocols and not (coalesce and not coalescing),
                    unavailable_reason=reason,
                )
            )
    return variants


def api_settings_fields() -> Mapping[str, Any]:
    """`api.settings.Settings.model_fields` of the API in this checkout."""
    from api.settings import Settings

    return Settings.model_fields


def all_setups() -> list[Setup]:
    """Every setup in run order: ceiling, naive, tuned (its RPS sets the reference load),
    then the split variants."""
    return [CEILING, NAIVE, TUNED, *split_variants(api_settings_fields())]


# --- running a setup ---------------------------------------------------------------------


def _taskset(cpus: tuple[int, ...]) -> list[str]:
    return ["taskset", "-c", ",".join(map(str, cpus))] if cpus else []


class RunningSetup:
    """A started setup: its processes, its URL, its process tree. Stop with `stop()`.

    `processes` are all the setup's processes (measured); `owned` are the ones this
    object stops. A serving tier shared by several split variants is measured with each
    variant but stopped by whoever started it.
    """

    def __init__(
        self,
        setup: Setup,
        workers: int,
        url: str,
        processes: list[Process],
        owned: list[Process] | None = None,
    ) -> None:
        self.setup = setup
        self.workers = workers
        self.url = url
        self.processes = processes
        self.owned = list(processes) if owned is None else owned

    def pids(self) -> list[int]:
        """Every live process of the setup (roots and the workers they forked)."""
        return process_tree(p.pid for p in self.processes)

    def roles(self) -> dict[int, str]:
        """pid → role: the process's name for a root, "<name> worker" for its children."""
        roles = {}
        for proc in self.processes:
            for pid in process_tree([proc.pid]):
                roles[pid] = proc.name if pid == proc.pid else f"{proc.name} worker"
        return roles

    def commands(self) -> list[str]:
        """The command lines that were started, for the report."""
        return [" ".join(p.args) for p in self.processes]

    def stop(self) -> None:
        """Stop what this object owns, the API before serving (as run-server.sh does)."""
        for proc in reversed(self.owned):
            proc.stop()

    def __enter__(self) -> RunningSetup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class NotAvailable(SetupError):
    """The setup cannot run with the code in this checkout yet (reported as skipped)."""


@dataclass
class Serving:
    """A running `python -m serving` with the fraud model AVAILABLE."""

    process: Process
    rest_port: int
    grpc_port: int
    cpus: tuple[int, ...]

    def grpc_listening(self) -> bool:
        """True when something accepts TCP connections on the gRPC port."""
        with socket.socket() as s:
            s.settimeout(0.5)
            return s.connect_ex(("127.0.0.1", self.grpc_port)) == 0

    def stop(self) -> None:
        """Stop the model server."""
        self.process.stop()


def start_serving(*, cpus: tuple[int, ...], run_dir: Path, tag: str) -> Serving:
    """`python -m serving` on loopback with TF Serving's flags, the fraud model only, one TF
    thread per CPU; returns once model status reports the fraud model AVAILABLE.

    Raises:
        SetupError: it exited or did not report AVAILABLE within READY_TIMEOUT_S.
    """
    rest_port, grpc_port = free_port(), free_port()
    threads = max(1, len(cpus))
    process = Process(
        "serving",
        [
            *_taskset(cpus),
            sys.executable,
            "-m",
            "serving",
            f"--port={grpc_port}",
            f"--rest_api_port={rest_port}",
            "--rest_api_host=127.0.0.1",
            # The fraud model alone, as the in-process setups load it (models.config would
            # add the digits CNN and its memory to the split's total only).
            f"--model_name={MODEL_NAME}",
            f"--model_base_path={REPO / 'models' / MODEL_NAME}",
            f"--tensorflow_intra_op_parallelism={threads}",
            f"--tensorflow_inter_op_parallelism={threads}",
        ],
        run_dir / f"{tag}-serving.log",
        env=dict(_BASE_ENV),
    )
    try:
        wait_until(
            lambda: get_contains(
                f"http://127.0.0.1:{rest_port}/v1/models/{MODEL_NAME}", '"AVAILABLE"'
            ),
            timeout_s=READY_TIMEOUT_S,
            what=f"serving to report model '{MODEL_NAME}' AVAILABLE",
            watch=[process],
        )
    except BaseException:
        process.stop()
        raise
    return Serving(process, rest_port, grpc_port, cpus)


def _wait_gunicorn_ready(proc: Process, workers: int, url: str, probe: bytes) -> None:
    wait_until(
        lambda: log_count(proc, STARTUP_COMPLETE) >= workers,
        timeout_s=READY_TIMEOUT_S,
        what=f"{workers} worker(s) of {proc.name} to finish startup",
        watch=[proc],
        poll_s=0.25,
    )
    scored = Probe(url, probe)
    try:
        wait_until(
            scored,
            timeout_s=PROBE_TIMEOUT_S,
            what=f"{proc.name} to score a transaction",
            watch=[proc],
            poll_s=0.25,
        )
    except SetupError as exc:
        raise SetupError(
            f"{proc.name} did not score a transaction: last answer {scored.last}\n{exc}"
        ) from None


def _gunicorn_args(setup: Setup, workers: int, port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gunicorn",
        f"--config={INPROCESS_GUNICORN_CONF}",
        f"--workers={workers}",
        f"--bind=127.0.0.1:{port}",
        *(["--preload"] if setup.preload else []),
        setup.app,
    ]


def start(
    setup: Setup,
    *,
    workers: int,
    cpus: tuple[int, ...],
    run_dir: Path,
    probe: bytes,
    serving: Serving | None = None,
) -> RunningSetup:
    """Start `setup` with `workers` API workers pinned to `cpus`; return when it is ready.

    Ready means: every worker has finished its lifespan startup and a real transaction
    (`probe`) is scored 2xx. A split setup uses `serving` when given (and leaves it
    running on stop), else starts its own model server first.

    Raises:
        NotAvailable: the setup needs something this checkout does not have yet (an API
            setting, serving's gRPC port).
        SetupError: a process exited or did not become ready in time (processes already
            started are stopped).
    """
    if not setup.available:
        raise NotAvailable(setup.unavailable_reason)
    tag = f"{setup.name}-w{workers}"
    if setup.kind == "inprocess":
        port = free_port()
        url = f"http://127.0.0.1:{port}{SCORE_PATH}"
        proc = Process(
            "gunicorn",
            [*_taskset(cpus), *_gunicorn_args(setup, workers, port)],
            run_dir / f"{tag}.log",
            env={**_BASE_ENV, **setup.env},
        )
        try:
            _wait_gunicorn_ready(proc, workers, url, probe)
        except BaseException:
            proc.stop()
            raise
        return RunningSetup(setup, workers, url, [proc])

    own_serving = serving is None
    if serving is None:
        serving = start_serving(cpus=cpus, run_dir=run_dir, tag=tag)
    owned: list[Process] = [serving.process] if own_serving else []
    try:
        if setup.env.get("SERVING_PROTOCOL") == "grpc":
            try:
                wait_until(
                    serving.grpc_listening,
                    timeout_s=GRPC_LISTEN_TIMEOUT_S,
                    what="serving's gRPC port",
                    watch=[serving.process],
                )
            except SetupError:
                raise NotAvailable(
                    f"not available yet: python -m serving does not listen on its gRPC "
                    f"port (--port={serving.grpc_port}) within {GRPC_LISTEN_TIMEOUT_S:g} s"
                ) from None
        api_port = free_port()
        url = f"http://127.0.0.1:{api_port}{SCORE_PATH}"
        env = {
            **_BASE_ENV,
            "API_BIND": f"127.0.0.1:{api_port}",
            "WEB_CONCURRENCY": str(workers),
            "SERVING_URL": f"http://127.0.0.1:{serving.rest_port}",
            # Serving runs the fraud model alone: the API serves that route only (it
            # refuses to start with a route whose model serving does not have).
            "MODEL_ROUTES": "fraud",
            **setup.env,
        }
        if setup.grpc_target_env:
            env[setup.grpc_target_env] = f"127.0.0.1:{serving.grpc_port}"
        if setup.events_path_env:
            env[setup.events_path_env] = str(run_dir / f"{tag}-score-events.jsonl")
        api = Process(
            "api",
            [
                *_taskset(cpus),
                sys.executable,
                "-m",
                "gunicorn",
                "-c",
                str(REPO / "gunicorn.conf.py"),
                # One fixed control-socket path per user otherwise (gunicorn >= 25.1).
                "--no-control-socket",
                "api.app:create_app()",
            ],
            run_dir / f"{tag}-api.log",
            env=env,
        )
        owned.append(api)
        _wait_gunicorn_ready(api, workers, url, probe)
        return RunningSetup(setup, workers, url, [serving.process, api], owned)
    except BaseException:
        for proc in reversed(owned):
            proc.stop()
        raise
