"""The serving tier alone: ``python -m serving`` on the fraud model, saturated over REST and gRPC.

    python -m bench.serving_tier              # full matrix, about 6 minutes on 2 cores
    python -m bench.serving_tier --quick      # shorter runs
    python -m bench.serving_tier --profile    # also py-spy the server at gRPC saturation

For every combination of

* server CPUs: 1 core (``taskset -c 0``) and 2 cores (``taskset -c 0,1``);
* batching: ``off``; ``default`` -- ``--enable_batching`` with TF Serving's default parameters
  (no ``--batching_parameters_file``: ``batch_timeout_micros`` 0, so a batch only forms while
  every batch thread is busy; 1-core server only); ``tuned`` -- a parameters file as TF Serving's
  batching guide suggests for CPU throughput (:data:`TUNED_BATCHING`: a 2 ms
  ``batch_timeout_micros``, ``num_batch_threads`` left at the server's CPUs);
* protocol: REST (``:predict``, JSON ``instances``) and gRPC (``PredictionService/Predict``,
  ``tensor_content``);
* request size: 1 row and 256 rows of the model's 11 features;

the server is saturated closed-loop for ``--duration`` seconds after a warm-up, and the run records
answers per second, predictions (rows) per second, latency percentiles, errors, the server's and
the load generator's CPU use (``/proc``), the CPU the rest of the machine used meanwhile (a busy
machine lowers every figure; runs where it exceeds 0.25 cores are flagged), and the mean batch
size (from the server's own ``:tensorflow:serving:batching_session:processed_batch_size``
metric). Rows come from
``models.transactions`` through the API's feature extraction, so the model sees realistic inputs;
request bodies cycle through a pool of 64.

Load generators, on the CPU the server does not use (CPU 1; with a 2-core server they share it):

* REST: wrk (``bench.load``'s closed loop, ``-c`` connections).
* gRPC: there is no ghz or grpcurl here, so this module's own generator (``loadgen``
  subcommand): one process, ``grpc.aio``, ``--grpc-concurrency`` coroutines over one channel,
  each sending pre-serialized requests back to back (no proto work per call). Python is slow
  enough to be the limit, so its ceiling is measured first against a no-op gRPC server
  (``null-server`` subcommand, canned answer, on the server's CPU) and printed beside the
  results: a gRPC figure close to that ceiling means the generator, not the server, was the
  limit.

Results: a table on stdout and ``bench/results/serving-tier-<UTC time>.json``. Goals (the serving
issue): >= 3,000 answers/s on one core over gRPC with batching on; >= 100,000 predictions/s with
256-row requests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

from bench.load import LoadSettings, run_closed_loop
from bench.processes import REPO, Process, SetupError, free_port, wait_until
from bench.procfs import process_tree, system_cpu_ticks, tree_cpu_ticks

RESULTS_DIR = REPO / "bench" / "results"
MODEL_NAME = "fraud"
MODEL_DIR = REPO / "models" / "fraud"
INPUT_NAME = "features"
N_FEATURES = 11
POOL_REQUESTS = 64
PREDICT_METHOD = "/tensorflow.serving.PredictionService/Predict"
CLK_TCK = os.sysconf("SC_CLK_TCK")
GOAL_GRPC_RPS_ONE_CORE = 3000
BUSY_MACHINE_CORES = 0.25
#: ``--batching_parameters_file`` of the ``tuned`` runs (BatchingParameters text proto).
TUNED_BATCHING = (
    "max_batch_size { value: 512 }\n"
    "batch_timeout_micros { value: 2000 }\n"
    "max_enqueued_batches { value: 100 }\n"
)
GOAL_PREDICTIONS_PER_S = 100_000
READY_TIMEOUT_S = 120.0


# ---- workload ---------------------------------------------------------------------------------


def feature_rows(n: int, seed: int = 2026) -> np.ndarray:
    """``n`` feature vectors, float32 ``[n, 11]``, from generated transactions (the API's own
    validation and feature extraction, as in production)."""
    from api.features import extract_features
    from api.schemas import Transaction
    from models.transactions import generate_transactions

    rows = [
        extract_features(Transaction.model_validate(labeled.body))
        for labeled in generate_transactions(n, seed=seed)
    ]
    return np.asarray(rows, np.float32)


def request_batches(rows_per_request: int, count: int = POOL_REQUESTS) -> list[np.ndarray]:
    """``count`` distinct requests of ``rows_per_request`` rows each (rows reused cyclically)."""
    rows = feature_rows(min(4096, rows_per_request * count))
    return [
        np.take(rows, range(i * rows_per_request, (i + 1) * rows_per_request), axis=0, mode="wrap")
        for i in range(count)
    ]


def write_rest_pool(path: Path, rows_per_request: int) -> Path:
    """wrk's body pool: one ``{"instances": [[11 floats], ...]}`` document per line."""
    lines = [
        orjson.dumps({"instances": batch.tolist()}) for batch in request_batches(rows_per_request)
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def grpc_requests(rows_per_request: int) -> list[bytes]:
    """Serialized ``PredictRequest``s, inputs in ``tensor_content`` (the API's wire-compatible
    protos: no TensorFlow import in the load generator)."""
    from api.protos.tensorflow.core.framework import tensor_pb2, types_pb2
    from api.protos.tensorflow_serving.apis import predict_pb2

    out = []
    for batch in request_batches(rows_per_request):
        request = predict_pb2.PredictRequest()
        request.model_spec.name = MODEL_NAME
        request.model_spec.signature_name = "serving_default"
        tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT)
        for size in batch.shape:
            tensor.tensor_shape.dim.add(size=size)
        tensor.tensor_content = np.ascontiguousarray(batch, "<f4").tobytes()
        request.inputs[INPUT_NAME].CopyFrom(tensor)
        out.append(request.SerializeToString())
    return out


# ---- the gRPC load generator (its own process) ------------------------------------------------


def _percentile(sorted_values: Sequence[float], p: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(p / 100 * len(sorted_values)) - 1))
    return sorted_values[index]


async def _drive_grpc(
    target: str, rows: int, concurrency: int, duration_s: float, warmup_s: float
) -> dict[str, Any]:
    import grpc

    bodies = grpc_requests(rows)
    limit = 256 * 1024 * 1024
    options = [("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit)]
    async with grpc.aio.insecure_channel(target, options=options) as channel:
        predict = channel.unary_unary(PREDICT_METHOD)  # bytes in, bytes out
        await predict(bodies[0], timeout=30.0)  # fails fast if the server is not there
        loop = asyncio.get_running_loop()
        measure_from = loop.time() + warmup_s
        stop_at = measure_from + duration_s
        latencies: list[float] = []
        errors: dict[str, int] = {}
        ok = 0

        async def worker(offset: int) -> None:
            nonlocal ok
            index = offset
            while True:
                started = loop.time()
                if started >= stop_at:
                    return
                body = bodies[index % len(bodies)]
                index += 1
                try:
                    await predict(body, timeout=10.0)
                except grpc.aio.AioRpcError as exc:
                    if started >= measure_from:
                        errors[exc.code().name] = errors.get(exc.code().name, 0) + 1
                    continue
                if started >= measure_from:
                    ok += 1
                    latencies.append(loop.time() - started)

        cpu_before = time.process_time()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        cpu = time.process_time() - cpu_before
    latencies.sort()
    return {
        "ok": ok,
        "errors": errors,
        "duration_s": duration_s,
        "rps": ok / duration_s,
        "p50_ms": _percentile(latencies, 50) * 1e3,
        "p99_ms": _percentile(latencies, 99) * 1e3,
        "load_cpu_cores": cpu / (duration_s + warmup_s),
    }


def _null_server(port: int) -> None:
    """A gRPC server answering every Predict with a canned response: the generator's ceiling."""
    import grpc

    from api.protos.tensorflow_serving.apis import predict_pb2

    answer = predict_pb2.PredictResponse()
    answer.model_spec.name = MODEL_NAME
    answer.outputs["fraud_score"].float_val.append(0.5)
    canned = answer.SerializeToString()

    async def predict(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return canned

    async def serve() -> None:
        server = grpc.aio.server()
        handler = grpc.method_handlers_generic_handler(
            "tensorflow.serving.PredictionService",
            {"Predict": grpc.unary_unary_rpc_method_handler(predict)},
        )
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        print("null server ready", flush=True)
        await server.wait_for_termination()

    asyncio.run(serve())


# ---- one server configuration ------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """One server start: which CPUs, and batching ``off``, ``default`` or ``tuned``."""

    cpus: tuple[int, ...]
    batching: str

    @property
    def label(self) -> str:
        return (
            f"{len(self.cpus)} core{'s' if len(self.cpus) > 1 else ''}, batching {self.batching}"
        )


@dataclass
class Run:
    """One saturation run against one server configuration."""

    protocol: str
    server_cpus: int
    batching: str
    rows_per_request: int
    connections: int
    rps: float = 0.0
    predictions_per_s: float = 0.0
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    errors: dict[str, int] = field(default_factory=dict)
    server_cpu_cores: float = 0.0
    load_cpu_cores: float = 0.0
    other_cpu_cores: float = 0.0  # the rest of the machine meanwhile
    mean_batch_size: float | None = None
    note: str = ""


def _taskset(cpus: Sequence[int]) -> list[str]:
    return ["taskset", "-c", ",".join(map(str, cpus))]


def _ready(url: str) -> bool:
    try:
        response = httpx.get(url, timeout=2.0)
    except httpx.HTTPError:
        return False
    return response.status_code == 200 and any(
        v["state"] == "AVAILABLE" for v in response.json()["model_version_status"]
    )


@contextlib.contextmanager
def serving(config: Config, workdir: Path) -> Iterator[tuple[Process, str, str]]:
    """``python -m serving`` on ``config.cpus`` with the fraud model; yields (process, REST base
    URL, gRPC target) once the model is AVAILABLE, and stops it (SIGTERM) afterwards."""
    models_config = workdir / "models.config"
    models_config.write_text(
        f'model_config_list {{ config {{ name: "{MODEL_NAME}" base_path: "{MODEL_DIR}" '
        'model_platform: "tensorflow" } }\n'
    )
    monitoring = workdir / "monitoring.config"
    monitoring.write_text("prometheus_config { enable: true }\n")
    rest_port, grpc_port = free_port(), free_port()
    args = [
        *_taskset(config.cpus),
        sys.executable,
        "-m",
        "serving",
        f"--port={grpc_port}",
        "--grpc_host=127.0.0.1",
        f"--rest_api_port={rest_port}",
        "--rest_api_host=127.0.0.1",
        f"--model_config_file={models_config}",
        f"--monitoring_config_file={monitoring}",
        "--file_system_poll_wait_seconds=0",
    ]
    if config.batching != "off":
        args.append("--enable_batching")
    if config.batching == "tuned":
        parameters = workdir / "batching.config"
        parameters.write_text(TUNED_BATCHING)
        args.append(f"--batching_parameters_file={parameters}")
    name = f"serving-{len(config.cpus)}cpu-batching-{config.batching}"
    proc = Process(name, args, workdir / f"{name}.log")
    rest = f"http://127.0.0.1:{rest_port}"
    try:
        wait_until(
            lambda: _ready(f"{rest}/v1/models/{MODEL_NAME}"),
            timeout_s=READY_TIMEOUT_S,
            what=f"{name}: model {MODEL_NAME} AVAILABLE",
            watch=[proc],
        )
        yield proc, rest, f"127.0.0.1:{grpc_port}"
    finally:
        proc.stop()


def _batch_counters(rest: str) -> tuple[float, float]:
    """(sum, count) of ``processed_batch_size`` from the server's Prometheus page."""
    page = httpx.get(f"{rest}/monitoring/prometheus/metrics", timeout=5.0).text
    prefix = r"^:tensorflow:serving:batching_session:processed_batch_size"
    total = re.search(prefix + r"_sum\{\} (\S+)$", page, re.MULTILINE)
    count = re.search(prefix + r"_count\{\} (\S+)$", page, re.MULTILINE)
    return (float(total[1]) if total else 0.0, float(count[1]) if count else 0.0)


class _CpuMeter:
    """CPU time of a process tree, and of the whole machine, over an interval, in cores."""

    def __init__(self, pid: int) -> None:
        self._pids = process_tree([pid])
        self._ticks = sum(tree_cpu_ticks(self._pids).values())
        self._machine = system_cpu_ticks()
        self._started = time.monotonic()

    def cores(self) -> tuple[float, float]:
        """(the tree's cores, the whole machine's busy cores) since construction."""
        elapsed = max(1e-9, time.monotonic() - self._started) * CLK_TCK
        ticks = sum(tree_cpu_ticks(self._pids).values()) - self._ticks
        return ticks / elapsed, (system_cpu_ticks() - self._machine) / elapsed


def run_rest(
    rest: str, proc: Process, config: Config, rows: int, args: argparse.Namespace, pool: Path
) -> Run:
    """wrk closed loop against ``:predict``; warm-up run first (not counted)."""
    run = Run("REST", len(config.cpus), config.batching, rows, args.rest_connections)
    load = LoadSettings(
        url=f"{rest}/v1/models/{MODEL_NAME}:predict",
        pool=pool,
        cpus=tuple(args.load_cpus),
        timeout_s=10.0,
    )
    run_closed_loop(load, connections=args.rest_connections, duration_s=args.warmup)
    batches = _batch_counters(rest)
    meter = _CpuMeter(proc.pid)
    result = run_closed_loop(load, connections=args.rest_connections, duration_s=args.duration)
    run.server_cpu_cores, machine = meter.cores()
    run.load_cpu_cores = result.load_cpu_cores
    run.other_cpu_cores = max(0.0, machine - run.server_cpu_cores - run.load_cpu_cores)
    summary = result.summary
    run.rps = summary.rps * (1 - summary.errors.status / max(1, summary.requests))
    run.predictions_per_s = run.rps * rows
    run.p50_ms = summary.percentiles_ms.get("50", float("nan"))
    run.p99_ms = summary.percentiles_ms.get("99", float("nan"))
    run.errors = {k: v for k, v in asdict(summary.errors).items() if v}
    run.mean_batch_size = _mean_batch(batches, _batch_counters(rest), config)
    return run


def _loadgen(target: str, rows: int, args: argparse.Namespace) -> dict[str, Any]:
    command = [
        *_taskset(args.load_cpus),
        sys.executable,
        "-m",
        "bench.serving_tier",
        "loadgen",
        f"--target={target}",
        f"--rows={rows}",
        f"--concurrency={args.grpc_concurrency}",
        f"--duration={args.duration}",
        f"--warmup={args.warmup}",
    ]
    done = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=args.duration + 120, check=False
    )
    if done.returncode != 0:
        raise SetupError(f"gRPC load generator failed:\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def run_grpc(
    grpc_target: str, rest: str, proc: Process, config: Config, rows: int, args: argparse.Namespace
) -> Run:
    """The gRPC generator's closed loop (its warm-up is not counted)."""
    run = Run("gRPC", len(config.cpus), config.batching, rows, args.grpc_concurrency)
    batches = _batch_counters(rest)
    meter = _CpuMeter(proc.pid)
    result = _loadgen(grpc_target, rows, args)
    # The meter spans warm-up and run: both saturate the server, so the rate is the same.
    run.server_cpu_cores, machine = meter.cores()
    run.rps = result["rps"]
    run.predictions_per_s = run.rps * rows
    run.p50_ms, run.p99_ms = result["p50_ms"], result["p99_ms"]
    run.errors = result["errors"]
    run.load_cpu_cores = result["load_cpu_cores"]
    run.other_cpu_cores = max(0.0, machine - run.server_cpu_cores - run.load_cpu_cores)
    run.mean_batch_size = _mean_batch(batches, _batch_counters(rest), config)
    return run


def _mean_batch(
    before: tuple[float, float], after: tuple[float, float], config: Config
) -> float | None:
    if config.batching == "off" or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def grpc_ceiling(rows: int, args: argparse.Namespace, workdir: Path) -> Run:
    """The gRPC generator against a no-op server on the server CPU: the most it can measure."""
    port = free_port()
    server = Process(
        "null-grpc",
        [
            *_taskset(args.server_cpus_one),
            sys.executable,
            "-m",
            "bench.serving_tier",
            "null-server",
            f"--port={port}",
        ],
        workdir / f"null-grpc-{rows}.log",
    )
    run = Run("gRPC ceiling", 1, "off", rows, args.grpc_concurrency)
    try:
        wait_until(
            lambda: "null server ready" in server.log(),
            timeout_s=60,
            what="the no-op gRPC server",
            watch=[server],
        )
        meter = _CpuMeter(server.pid)
        result = _loadgen(f"127.0.0.1:{port}", rows, args)
        run.server_cpu_cores, machine = meter.cores()
    finally:
        server.stop()
    run.other_cpu_cores = max(0.0, machine - run.server_cpu_cores - result["load_cpu_cores"])
    run.rps = result["rps"]
    run.predictions_per_s = run.rps * rows
    run.p50_ms, run.p99_ms = result["p50_ms"], result["p99_ms"]
    run.errors = result["errors"]
    run.load_cpu_cores = result["load_cpu_cores"]
    run.note = "no-op server: the load generator's own limit"
    return run


def profile_server(
    grpc_target: str, proc: Process, args: argparse.Namespace, workdir: Path
) -> dict[str, Any]:
    """py-spy the server (``--nonblocking``) during a gRPC saturation run; top functions."""
    from bench.profile import parse_collapsed, pyspy_path, summarize

    raw = workdir / "profile-serving.txt"
    recorder = subprocess.Popen(
        [
            *_taskset(args.load_cpus),
            pyspy_path(),
            "record",
            f"--pid={proc.pid}",
            f"--duration={int(args.duration)}",
            "--rate=250",
            "--format=raw",
            f"--output={raw}",
            "--nonblocking",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    result = _loadgen(grpc_target, 1, args)
    output, _ = recorder.communicate(timeout=args.duration + 60)
    if recorder.returncode != 0 or not raw.exists():
        return {"error": output.decode(errors="replace")[-500:]}
    # py-spy writes threads caught outside Python code as a stack with no frames (" 7"), which
    # bench.profile's parser refuses; they carry no function to report anyway.
    lines = [line for line in raw.read_text().splitlines() if line and not line.startswith(" ")]
    try:
        summary = summarize(parse_collapsed("\n".join(lines)), top=15)
    except ValueError as exc:
        return {"error": str(exc)[:500], "raw": str(raw)}
    summary["rps_while_profiled"] = round(result["rps"], 1)
    summary["raw"] = str(raw)
    return summary


# ---- the whole benchmark ----------------------------------------------------------------------


def _table(runs: Sequence[Run]) -> str:
    header = (
        f"{'protocol':<13}{'cores':>6}{'batching':>9}{'rows':>6}{'conns':>6}{'answers/s':>11}"
        f"{'pred/s':>11}{'p50 ms':>8}{'p99 ms':>8}{'batch':>7}{'srv CPU':>8}{'gen CPU':>8}"
        f"{'other':>7}  errors"
    )
    lines = [header, "-" * len(header)]
    for run in runs:
        batch = f"{run.mean_batch_size:.1f}" if run.mean_batch_size else "-"
        errors = ", ".join(f"{k}={v}" for k, v in run.errors.items()) or "0"
        busy = "*" if run.other_cpu_cores > BUSY_MACHINE_CORES else " "
        lines.append(
            f"{run.protocol:<13}{run.server_cpus:>6}{run.batching:>9}"
            f"{run.rows_per_request:>6}{run.connections:>6}{run.rps:>11,.0f}"
            f"{run.predictions_per_s:>11,.0f}{run.p50_ms:>8.2f}{run.p99_ms:>8.2f}{batch:>7}"
            f"{run.server_cpu_cores:>8.2f}{run.load_cpu_cores:>8.2f}{run.other_cpu_cores:>6.2f}"
            f"{busy}  {errors}" + (f"  ({run.note})" if run.note else "")
        )
    lines.append(
        f"* the rest of the machine used more than {BUSY_MACHINE_CORES} cores during the run: "
        "its figures are lower than on a quiet machine"
    )
    return "\n".join(lines)


def _goals(runs: Sequence[Run]) -> list[dict[str, Any]]:
    def best(candidates: list[Run], key: str) -> Run | None:
        return max(candidates, key=lambda r: float(getattr(r, key)), default=None)

    grpc_one_core = best(
        [
            r
            for r in runs
            if r.protocol == "gRPC"
            and r.server_cpus == 1
            and r.batching != "off"
            and r.rows_per_request == 1
        ],
        "rps",
    )
    big = best(
        [r for r in runs if r.rows_per_request == 256 and r.protocol in ("gRPC", "REST")],
        "predictions_per_s",
    )

    def where(run: Run | None) -> str:
        if run is None:
            return "not measured"
        return f"{run.protocol}, {run.server_cpus} core(s), batching {run.batching}"

    return [
        {
            "goal": f">= {GOAL_GRPC_RPS_ONE_CORE:,} answers/s on 1 core, gRPC, batching on",
            "measured": round(grpc_one_core.rps) if grpc_one_core else 0,
            "where": where(grpc_one_core),
            "held": bool(grpc_one_core and grpc_one_core.rps >= GOAL_GRPC_RPS_ONE_CORE),
        },
        {
            "goal": f">= {GOAL_PREDICTIONS_PER_S:,} predictions/s with 256-row requests",
            "measured": round(big.predictions_per_s) if big else 0,
            "where": where(big),
            "held": bool(big and big.predictions_per_s >= GOAL_PREDICTIONS_PER_S),
        },
    ]


def benchmark(args: argparse.Namespace) -> int:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=f"serving-tier-{stamp}-", dir=RESULTS_DIR))
    pools = {rows: write_rest_pool(workdir / f"rest-{rows}.jsonl", rows) for rows in args.rows}
    configs = [Config(tuple(args.server_cpus_one), mode) for mode in ("off", "default", "tuned")]
    if not args.one_core_only:
        configs += [Config(tuple(args.server_cpus_two), mode) for mode in ("off", "tuned")]
    runs: list[Run] = []
    profile: dict[str, Any] | None = None

    def say(message: str) -> None:
        print(f"[serving-tier] {message}", file=sys.stderr, flush=True)

    for rows in args.rows:
        say(f"gRPC load generator ceiling, {rows}-row requests")
        runs.append(grpc_ceiling(rows, args, workdir))
    for config in configs:
        say(f"starting the server: {config.label}")
        with serving(config, workdir) as (proc, rest, grpc_target):
            for rows in args.rows:
                say(f"{config.label}: REST, {rows}-row requests")
                runs.append(run_rest(rest, proc, config, rows, args, pools[rows]))
                say(f"{config.label}: gRPC, {rows}-row requests")
                runs.append(run_grpc(grpc_target, rest, proc, config, rows, args))
            if args.profile and config.batching == "tuned" and len(config.cpus) == 1:
                say(f"{config.label}: profiling the server with py-spy during gRPC saturation")
                profile = profile_server(grpc_target, proc, args, workdir)
    goals = _goals(runs)
    report = {
        "when": stamp,
        "machine": {"cpus": os.cpu_count(), "load_cpus": args.load_cpus},
        "settings": {
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "rest_connections": args.rest_connections,
            "grpc_concurrency": args.grpc_concurrency,
            "tuned_batching_parameters": TUNED_BATCHING,
        },
        "runs": [asdict(run) for run in runs],
        "goals": goals,
        "profile": profile,
    }
    out = RESULTS_DIR / f"serving-tier-{stamp}.json"
    out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(_table(runs))
    print()
    for goal in goals:
        mark = "held" if goal["held"] else "NOT held"
        print(f"goal {goal['goal']}: {goal['measured']:,} ({goal['where']}) -- {mark}")
    if profile and "self" in profile:
        print("\nserver profile at gRPC saturation (1 core, batching tuned), self time:")
        for name, share in profile["self"][:12]:
            print(f"  {share:6.1%}  {name}")
    print(f"\nresults: {out.relative_to(REPO)} (logs in {workdir.relative_to(REPO)})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.serving_tier",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command")
    gen = sub.add_parser("loadgen", help="(internal) the gRPC load generator")
    gen.add_argument("--target", required=True)
    gen.add_argument("--rows", type=int, default=1)
    gen.add_argument("--concurrency", type=int, default=32)
    gen.add_argument("--duration", type=float, default=10.0)
    gen.add_argument("--warmup", type=float, default=2.0)
    null = sub.add_parser("null-server", help="(internal) a no-op gRPC Predict server")
    null.add_argument("--port", type=int, required=True)
    parser.add_argument("--quick", action="store_true", help="5 s runs, 1 s warm-up")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per run")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds before each run")
    parser.add_argument("--rest-connections", type=int, default=32)
    parser.add_argument("--grpc-concurrency", type=int, default=32)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 256])
    parser.add_argument("--one-core-only", action="store_true", help="skip the 2-core server")
    parser.add_argument(
        "--profile", action="store_true", help="py-spy the 1-core tuned-batching server"
    )
    args = parser.parse_args(argv)
    if args.command == "loadgen":
        result = asyncio.run(
            _drive_grpc(args.target, args.rows, args.concurrency, args.duration, args.warmup)
        )
        print(json.dumps(result))
        return 0
    if args.command == "null-server":
        _null_server(args.port)
        return 0
    if args.quick:
        args.duration, args.warmup = 5.0, 1.0
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        print("needs at least 2 CPUs (server and load generator apart)", file=sys.stderr)
        return 2
    args.server_cpus_one = [cpus[0]]
    args.server_cpus_two = cpus[:2]
    args.load_cpus = [cpus[-1]]
    return benchmark(args)


if __name__ == "__main__":
    sys.exit(main())
