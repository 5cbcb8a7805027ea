"""The serving tier alone: ``python -m serving`` on the fraud model, saturated over REST and gRPC.

    python -m bench.serving_tier              # full matrix, about 6 minutes on 2 cores
    python -m bench.serving_tier --quick      # shorter runs
    python -m bench.serving_tier --quick --protocols grpc --one-core-only --rows 1
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
answers per second, predictions (rows) per second, latency (what the generator reports: see
below), errors, the server's and the load generator's CPU use (``/proc``, ``getrusage``), the CPU
the rest of the machine used meanwhile (a busy machine lowers every figure; runs where it exceeds
0.25 cores are flagged ``*``), and the mean batch size (from the server's own
``:tensorflow:serving:batching_session:processed_batch_size`` metric). Rows come from
``models.transactions`` through the API's feature extraction, so the model sees realistic inputs.

Load generators, on the CPU the server does not use (CPU 1; with a 2-core server they share it):

* REST: wrk (``bench.load``'s closed loop, ``--rest-connections`` connections, one request in
  flight on each); request bodies cycle through a pool of 64. Latency: p50, p99, mean, sd, max.
* gRPC: h2load (Debian package ``nghttp2-client``: ``apt-get install nghttp2-client``), when it
  is on PATH. It is C and event-driven, so it is not the limit: unary gRPC calls are plain
  HTTP/2 POSTs (cleartext, prior knowledge) to ``/tensorflow.serving.PredictionService/Predict``
  with ``content-type: application/grpc`` and ``te: trailers``, whose body is the gRPC
  length-prefixed message (:func:`grpc_frame`). Closed loop: ``--grpc-connections`` connections
  x ``--grpc-streams`` concurrent streams each (default 4 x 8 = 32 in flight, as the REST runs'
  32 connections), ``-D`` seconds after h2load's own ``--warm-up-time``. h2load takes a single
  data file, so **every gRPC request carries the same body** (the first of the pool); batching
  and the model's cost do not depend on the values. h2load prints no latency percentiles, only
  min / max / mean / sd of each request's time: p50 and p99 are ``None`` (``-``) for its runs.
  h2load only sees HTTP statuses, and a gRPC error still arrives with HTTP 200 (``grpc-status``
  is in the trailers), so answers are verified another way: before each run the same body is
  sent once with grpcio and the answer must be OK with ``fraud_score`` float ``[rows, 1]``;
  during the run the server's own ``:tensorflow:serving:request_count`` (by status) is read
  before and after, and any non-OK answer, or fewer Predict calls counted by the server than
  h2load counted answers, flags the run (excluded from the goals; the command exits 1). The
  calls still in flight when h2load stops are cancelled by its closing the connections: up to
  connections x streams CANCELLED are expected and kept apart, not counted as errors.
* gRPC fallback, when h2load is not installed (or with ``--grpc-generator python``): this
  module's own generator (``loadgen`` subcommand), labelled so in the table and the JSON: one
  process, ``grpc.aio``, connections x streams coroutines over one channel, each sending
  pre-serialized requests (the pool of 64) back to back. Python is slow enough to be the limit
  (its ceiling is 3,200-6,200 calls/s here, close to what is measured).

The ceiling of whichever gRPC generator is used is measured first against a no-op gRPC server
(``null-server`` subcommand, grpc.aio, canned answer, on the server's CPU) and printed beside the
results. That no-op server is Python too: when the generator's CPU in that row is well under one
core, the no-op server, not the generator, was the limit, and the note says so with the
generator's answers per core of its CPU. In every row the ``gen CPU`` column shows how close the
generator was to its one CPU.

Results: a table on stdout and ``bench/results/serving-tier-<UTC time>.json``. Goals (the serving
issue): >= 3,000 answers/s on one core over gRPC with batching on; >= 100,000 predictions/s with
256-row requests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import math
import os
import re
import resource
import shutil
import statistics
import struct
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

from bench.load import LoadSettings, LoadToolError, parse_time_ms, run_closed_loop
from bench.processes import REPO, Process, SetupError, free_port, wait_until
from bench.procfs import process_tree, system_cpu_ticks, tree_cpu_ticks

RESULTS_DIR = REPO / "bench" / "results"
MODEL_NAME = "fraud"
MODEL_DIR = REPO / "models" / "fraud"
INPUT_NAME = "features"
OUTPUT_NAME = "fraud_score"  # float32 [rows, 1]
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
H2LOAD_INSTALL_HINT = "h2load is not on PATH; on Debian/Ubuntu: apt-get install nghttp2-client"
#: A generator using less of its CPU than this (cores) was not what limited a run.
GENERATOR_SATURATED_CORES = 0.9
#: gRPC's length prefix: 1 byte compressed flag, 4 bytes big-endian message length.
GRPC_PREFIX = struct.Struct(">BI")
#: Seconds a call (REST, Python generator) or an h2load connection may stay silent: an error.
CALL_TIMEOUT_S = 10.0
REQUEST_COUNT = ":tensorflow:serving:request_count"
BATCH_SIZE = ":tensorflow:serving:batching_session:processed_batch_size"


# ---- workload ---------------------------------------------------------------------------------


def feature_rows(n: int, seed: int = 2026) -> np.ndarray:
    """``n`` feature vectors, float32 ``[n, 11]``, from generated transactions (the API's own
    validation and feature extraction, as in production)."""
    from api.examples.fraud.features import extract_features
    from api.examples.fraud.schemas import Transaction
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


def grpc_frame(message: bytes) -> bytes:
    """One gRPC length-prefixed message, as it travels in an HTTP/2 DATA frame: a 0 byte (not
    compressed), the message's length as 4 bytes big-endian, then the message."""
    return GRPC_PREFIX.pack(0, len(message)) + message


def write_grpc_body(path: Path, message: bytes) -> Path:
    """h2load's ``--data`` file: ``message`` (a serialized ``PredictRequest``) framed for gRPC.
    h2load sends this same body with every request."""
    path.write_bytes(grpc_frame(message))
    return path


# ---- h2load: running it and reading its report ------------------------------------------------


@dataclass(frozen=True)
class H2loadSummary:
    """What h2load prints at the end of a timing-based (``-D``) run; counts cover the main
    duration only (not the warm-up), times are milliseconds."""

    protocol: str | None  # "h2c" once a connection was made ("Application protocol:"), or None
    rps: float  # h2load's "req/s": completed streams (any status) / the -D duration
    total: int
    started: int
    done: int
    succeeded: int  # answers with an HTTP status < 400 (h2load's req_status_success)
    failed: int
    errored: int
    timeout: int
    status: dict[str, int]  # "2xx", "3xx", "4xx", "5xx" -> answers
    data_bytes: int  # response DATA (gRPC messages), headers and trailers not included
    latency_min_ms: float
    latency_max_ms: float
    latency_mean_ms: float
    latency_sd_ms: float

    @property
    def errors(self) -> dict[str, int]:
        """The non-zero failure counters: failed, errored, timeout and non-2xx statuses."""
        counts = {"failed": self.failed, "errored": self.errored, "timeout": self.timeout}
        counts.update({f"http {k}": v for k, v in self.status.items() if k != "2xx"})
        return {k: v for k, v in counts.items() if v}


def parse_h2load(text: str) -> H2loadSummary:
    """Parse h2load's (nghttp2 1.x) closing report.

    h2load has no latency percentiles: "time for request" gives min, max, mean and sd only.

    Raises:
        LoadToolError: the report's "req/s", "requests:", "status codes:" or "time for
            request:" line is missing.
    """
    rps = re.search(r"^finished in \S+, ([0-9.]+) req/s", text, re.M)
    requests = re.search(
        r"^requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, "
        r"(\d+) errored, (\d+) timeout",
        text,
        re.M,
    )
    status = re.search(r"^status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", text, re.M)
    latency = re.search(r"^time for request:\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)", text, re.M)
    if not (rps and requests and status and latency):
        raise LoadToolError(f"h2load printed no report:\n{text[-2000:]}")
    data = re.search(r"^traffic: .*, \S+ \((\d+)\) data", text, re.M)
    protocol = re.search(r"^Application protocol: (\S+)", text, re.M)
    total, started, done, succeeded, failed, errored, timeout = map(int, requests.groups())
    return H2loadSummary(
        protocol=protocol[1] if protocol else None,
        rps=float(rps[1]),
        total=total,
        started=started,
        done=done,
        succeeded=succeeded,
        failed=failed,
        errored=errored,
        timeout=timeout,
        status=dict(zip(("2xx", "3xx", "4xx", "5xx"), map(int, status.groups()), strict=True)),
        data_bytes=int(data[1]) if data else 0,
        latency_min_ms=parse_time_ms(latency[1]),
        latency_max_ms=parse_time_ms(latency[2]),
        latency_mean_ms=parse_time_ms(latency[3]),
        latency_sd_ms=parse_time_ms(latency[4]),
    )


def _h2load_duration(seconds: float) -> str:
    """h2load's <DURATION>: an integer with a unit; milliseconds, at least 1."""
    return f"{max(1, round(seconds * 1000))}ms"


@functools.cache
def h2load_info(path: str) -> tuple[str, bool]:
    """(version line, whether it has ``--warm-up-time``) of the h2load at ``path``."""
    version = subprocess.run(
        [path, "--version"], capture_output=True, text=True, timeout=10, check=False
    ).stdout.strip()
    usage = subprocess.run(
        [path, "--help"], capture_output=True, text=True, timeout=10, check=False
    ).stdout
    return version or "h2load (unknown version)", "--warm-up-time" in usage


def h2load_command(
    h2load: str,
    url: str,
    body: Path,
    *,
    connections: int,
    streams: int,
    duration_s: float,
    warmup_s: float,
    cpus: Sequence[int],
) -> list[str]:
    """h2load's closed loop of unary gRPC calls: ``connections`` x ``streams`` in flight, for
    ``duration_s`` seconds after ``warmup_s`` (0: no ``--warm-up-time``), one thread per CPU
    in ``cpus`` (at most one per connection), pinned to them."""
    command = [
        *_taskset(cpus),
        h2load,
        f"--clients={connections}",
        f"--max-concurrent-streams={streams}",
        f"--threads={max(1, min(len(cpus) or 1, connections))}",
        f"--duration={_h2load_duration(duration_s)}",
    ]
    if warmup_s > 0:
        command.append(f"--warm-up-time={_h2load_duration(warmup_s)}")
    return [
        *command,
        # A connection silent this long is closed and its calls counted as errors.
        f"--connection-inactivity-timeout={_h2load_duration(CALL_TIMEOUT_S)}",
        f"--data={body}",
        "--header=content-type: application/grpc",
        "--header=te: trailers",
        url,
    ]


def _run_tool(args: Sequence[str], timeout_s: float) -> tuple[str, float]:
    """Run a load tool to completion: (stdout + stderr, its CPU in cores from the children's
    rusage delta over the wall time).

    Raises:
        LoadToolError: it exited non-zero or did not finish within ``timeout_s``.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    try:
        done = subprocess.run(
            args, cwd=REPO, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise LoadToolError(f"{args[0]} did not finish within {timeout_s:.0f}s") from exc
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        output = (done.stderr.strip() or done.stdout.strip())[-2000:]
        raise LoadToolError(f"{' '.join(args)} exited {done.returncode}: {output}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return done.stdout + done.stderr, cpu / wall if wall > 0 else 0.0


# ---- the Python gRPC load generator (its own process; the fallback) ---------------------------


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
                    await predict(body, timeout=CALL_TIMEOUT_S)
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
        "min_ms": latencies[0] * 1e3 if latencies else None,
        "mean_ms": statistics.fmean(latencies) * 1e3 if latencies else None,
        "sd_ms": statistics.pstdev(latencies) * 1e3 if latencies else None,
        "max_ms": latencies[-1] * 1e3 if latencies else None,
        "load_cpu_cores": cpu / (duration_s + warmup_s),
    }


def _null_server(port: int) -> None:
    """A gRPC server answering every Predict with a canned response: the generator's ceiling."""
    import grpc

    from api.protos.tensorflow_serving.apis import predict_pb2

    answer = predict_pb2.PredictResponse()
    answer.model_spec.name = MODEL_NAME
    answer.outputs[OUTPUT_NAME].float_val.append(0.5)
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


# ---- the gRPC load, whichever generator drives it ---------------------------------------------


@dataclass(frozen=True)
class Generator:
    """The gRPC load generator of this benchmark: ``h2load`` (its path) or ``python``."""

    kind: str  # "h2load" or "python"
    path: str | None = None  # h2load's binary
    fallback: bool = False  # python because h2load is not installed

    @property
    def label(self) -> str:
        """The name the table and the JSON give each of its runs."""
        if self.kind == "h2load":
            return "h2load"
        return "grpc.aio (fallback)" if self.fallback else "grpc.aio"

    def describe(self) -> str:
        """One line for the report: which generator, its version, or why it is the fallback."""
        if self.kind == "h2load":
            assert self.path is not None
            version, warmup = h2load_info(self.path)
            return version + ("" if warmup else " (no --warm-up-time: a separate warm-up run)")
        if self.fallback:
            return f"Python grpc.aio generator, FALLBACK ({H2LOAD_INSTALL_HINT})"
        return "Python grpc.aio generator (--grpc-generator python)"


def choose_generator(wanted: str) -> Generator:
    """``auto``: h2load if on PATH, else the Python generator (fallback); or as ``wanted``.

    Raises:
        SetupError: ``wanted`` is ``h2load`` and it is not on PATH.
    """
    path = shutil.which("h2load")
    if wanted == "python":
        return Generator("python")
    if path is None:
        if wanted == "h2load":
            raise SetupError(H2LOAD_INSTALL_HINT)
        return Generator("python", fallback=True)
    return Generator("h2load", path)


@dataclass(frozen=True)
class GrpcLoad:
    """One closed-loop gRPC run as the generator saw it (answers/s, milliseconds, cores).

    Latencies the generator does not report are ``None`` (h2load has no percentiles)."""

    answers: int  # answered calls in the measured interval (h2load: HTTP 2xx)
    rps: float  # answers / the measured interval
    errors: dict[str, int]  # the generator's own failure counts
    load_cpu_cores: float
    p50_ms: float | None = None
    p99_ms: float | None = None
    min_ms: float | None = None
    mean_ms: float | None = None
    sd_ms: float | None = None
    max_ms: float | None = None
    problems: tuple[str, ...] = ()  # reasons not to trust the run, seen by the generator


def h2load_load(summary: H2loadSummary, duration_s: float, load_cpu_cores: float) -> GrpcLoad:
    """A :class:`GrpcLoad` from h2load's report (answers: streams answered HTTP 2xx)."""
    problems = []
    if summary.protocol != "h2c":
        problems.append(f"h2load made no HTTP/2 connection (protocol {summary.protocol})")
    if summary.status["2xx"] == 0:
        problems.append("h2load got no answers")
    elif summary.data_bytes < GRPC_PREFIX.size * summary.status["2xx"]:
        # Each OK call's answer carries at least one framed message; a gRPC error does not.
        problems.append(
            f"answers carried {summary.data_bytes} bytes of DATA for {summary.status['2xx']} "
            "answers: most were gRPC errors (trailers only)"
        )
    answered = summary.status["2xx"] > 0  # else h2load prints 0us for every latency
    return GrpcLoad(
        answers=summary.status["2xx"],
        rps=summary.status["2xx"] / duration_s,
        errors=summary.errors,
        load_cpu_cores=load_cpu_cores,
        min_ms=summary.latency_min_ms if answered else None,
        mean_ms=summary.latency_mean_ms if answered else None,
        sd_ms=summary.latency_sd_ms if answered else None,
        max_ms=summary.latency_max_ms if answered else None,
        problems=tuple(problems),
    )


def _run_h2load(
    generator: Generator, target: str, rows: int, args: argparse.Namespace, workdir: Path
) -> GrpcLoad:
    assert generator.path is not None
    body = write_grpc_body(workdir / f"grpc-{rows}.bin", grpc_requests(rows)[0])
    _, has_warmup = h2load_info(generator.path)

    def command(duration_s: float, warmup_s: float) -> list[str]:
        return h2load_command(
            generator.path or "h2load",
            f"http://{target}{PREDICT_METHOD}",
            body,
            connections=args.grpc_connections,
            streams=args.grpc_streams,
            duration_s=duration_s,
            warmup_s=warmup_s,
            cpus=args.load_cpus,
        )

    timeout_s = args.duration + args.warmup + 60.0
    if has_warmup:
        text, cpu = _run_tool(command(args.duration, args.warmup), timeout_s)
    else:  # an h2load older than --warm-up-time: a separate run first, not counted
        _run_tool(command(args.warmup, 0.0), timeout_s)
        text, cpu = _run_tool(command(args.duration, 0.0), timeout_s)
    (workdir / f"h2load-{rows}-{time.monotonic_ns()}.txt").write_text(text)
    return h2load_load(parse_h2load(text), args.duration, cpu)


def _run_python_loadgen(target: str, rows: int, args: argparse.Namespace) -> GrpcLoad:
    command = [
        *_taskset(args.load_cpus),
        sys.executable,
        "-m",
        "bench.serving_tier",
        "loadgen",
        f"--target={target}",
        f"--rows={rows}",
        f"--concurrency={args.grpc_connections * args.grpc_streams}",
        f"--duration={args.duration}",
        f"--warmup={args.warmup}",
    ]
    done = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=args.duration + 120, check=False
    )
    if done.returncode != 0:
        raise SetupError(f"gRPC load generator failed:\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return GrpcLoad(
        answers=result["ok"],
        rps=result["rps"],
        errors=result["errors"],
        load_cpu_cores=result["load_cpu_cores"],
        p50_ms=result["p50_ms"],
        p99_ms=result["p99_ms"],
        min_ms=result["min_ms"],
        mean_ms=result["mean_ms"],
        sd_ms=result["sd_ms"],
        max_ms=result["max_ms"],
        problems=() if result["ok"] else ("the generator got no answers",),
    )


def drive_grpc(target: str, rows: int, args: argparse.Namespace, workdir: Path) -> GrpcLoad:
    """Saturate ``target`` with ``rows``-row Predict calls, closed loop, with the benchmark's
    generator (``args.generator``) pinned to ``args.load_cpus``; warm-up not counted."""
    generator: Generator = args.generator
    if generator.kind == "h2load":
        return _run_h2load(generator, target, rows, args, workdir)
    return _run_python_loadgen(target, rows, args)


def check_predict(target: str, message: bytes, rows: int | None) -> None:
    """Send ``message`` (a serialized ``PredictRequest``) once with grpcio and check the answer:
    OK and, when ``rows`` is given, ``fraud_score`` float ``[rows, 1]`` with ``rows`` values.

    Raises:
        SetupError: the call failed or the answer is not of that shape.
    """
    import grpc

    from api.protos.tensorflow.core.framework import types_pb2
    from api.protos.tensorflow_serving.apis import predict_pb2

    with grpc.insecure_channel(target) as channel:
        try:
            raw = channel.unary_unary(PREDICT_METHOD)(message, timeout=30.0)
        except grpc.RpcError as exc:
            raise SetupError(f"Predict on {target} failed: {exc.code().name} {exc.details()}") from exc
    if rows is None:
        return
    answer = predict_pb2.PredictResponse.FromString(raw)
    if OUTPUT_NAME not in answer.outputs:
        raise SetupError(f"Predict answered without {OUTPUT_NAME!r}: {sorted(answer.outputs)}")
    tensor = answer.outputs[OUTPUT_NAME]
    shape = [dim.size for dim in tensor.tensor_shape.dim]
    values = len(tensor.float_val) or len(tensor.tensor_content) // 4
    if tensor.dtype != types_pb2.DT_FLOAT or shape != [rows, 1] or values != rows:
        raise SetupError(
            f"Predict answered {OUTPUT_NAME} {types_pb2.DataType.Name(tensor.dtype)} {shape} "
            f"with {values} values; expected DT_FLOAT [{rows}, 1]"
        )


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
    """One saturation run against one server configuration.

    Latencies are milliseconds, as the generator reports them; ``None`` where it does not
    (h2load: no percentiles; wrk: no minimum)."""

    protocol: str
    server_cpus: int
    batching: str
    rows_per_request: int
    connections: int
    streams: int = 1  # concurrent requests per connection
    generator: str = ""
    rps: float = 0.0  # answers per second
    predictions_per_s: float = 0.0
    p50_ms: float | None = None
    p99_ms: float | None = None
    latency_min_ms: float | None = None
    latency_mean_ms: float | None = None
    latency_sd_ms: float | None = None
    latency_max_ms: float | None = None
    errors: dict[str, int] = field(default_factory=dict)  # the generator's
    server_answers: int | None = None  # Predict calls the server counted (warm-up included)
    server_errors: dict[str, int] = field(default_factory=dict)  # non-OK, by status
    server_cancelled_at_end: int = 0  # calls in flight when the generator stopped (not errors)
    server_cpu_cores: float = 0.0
    load_cpu_cores: float = 0.0
    other_cpu_cores: float = 0.0  # the rest of the machine meanwhile
    mean_batch_size: float | None = None
    flags: list[str] = field(default_factory=list)  # why the figures are not to be trusted
    note: str = ""

    @property
    def in_flight(self) -> int:
        """Requests the closed loop keeps outstanding."""
        return self.connections * self.streams

    def take_latency(self, load: GrpcLoad) -> None:
        """Copy the latencies a gRPC generator reported."""
        self.p50_ms, self.p99_ms = load.p50_ms, load.p99_ms
        self.latency_min_ms, self.latency_mean_ms = load.min_ms, load.mean_ms
        self.latency_sd_ms, self.latency_max_ms = load.sd_ms, load.max_ms


def _taskset(cpus: Sequence[int]) -> list[str]:
    """``taskset -c CPUS`` to prefix a command with; nothing for no CPUs (not pinned)."""
    return ["taskset", "-c", ",".join(map(str, cpus))] if cpus else []


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
    URL, gRPC target) once the model is AVAILABLE, and stops it (SIGTERM) afterwards. Its
    Prometheus page is on (``--monitoring_config_file``): the runs read its counters."""
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


# ---- the server's own counters ----------------------------------------------------------------


@dataclass(frozen=True)
class ServerCounters:
    """The server's Prometheus counters a run compares before and after."""

    batch_sum: float = 0.0  # processed_batch_size: rows in all batches run
    batch_count: float = 0.0  # ... and batches run
    requests: dict[str, float] = field(default_factory=dict)  # request_count by status


def _labels(text: str) -> dict[str, str]:
    return dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', text))


def parse_counters(page: str, model: str = MODEL_NAME) -> ServerCounters:
    """The batch-size histogram's sum and count, and ``request_count`` of ``model`` by status,
    from the server's Prometheus text page."""
    batch_sum = re.search(rf"^{BATCH_SIZE}_sum\{{\}} (\S+)$", page, re.M)
    batch_count = re.search(rf"^{BATCH_SIZE}_count\{{\}} (\S+)$", page, re.M)
    requests: dict[str, float] = {}
    for labels, value in re.findall(rf"^{REQUEST_COUNT}\{{(.*)\}} (\S+)$", page, re.M):
        parsed = _labels(labels)
        if parsed.get("model_name") == model:
            status = parsed.get("status", "")
            requests[status] = requests.get(status, 0.0) + float(value)
    return ServerCounters(
        batch_sum=float(batch_sum[1]) if batch_sum else 0.0,
        batch_count=float(batch_count[1]) if batch_count else 0.0,
        requests=requests,
    )


def _counters(rest: str) -> ServerCounters:
    # Generous: a server on a busy shared core has been seen to take 6 s to answer it.
    page = httpx.get(f"{rest}/monitoring/prometheus/metrics", timeout=30.0).text
    return parse_counters(page)


def check_server_counts(
    run: Run,
    before: ServerCounters,
    after: ServerCounters,
    generator_answers: int,
    in_flight: int = 0,
) -> None:
    """Record the run's answers by status as the server counted them, and flag the run if any
    was not OK or the server counted fewer Predict calls than the generator counted answers.

    Up to ``in_flight`` CANCELLED calls are not errors: a closed loop that stops (h2load
    closes its connections at the end of ``-D``) cancels the calls it still had in flight;
    they are kept apart in ``server_cancelled_at_end``.

    The second check matters: the server counts only calls that reach the core Predict (as
    ``serving.util.metrics`` says), so a body refused while it is decoded (e.g. ``tensor_content``
    of the wrong size: INVALID_ARGUMENT) is answered, HTTP 200 for h2load, and never counted.
    The server's counts include the warm-up, so it normally counts more than the generator."""
    delta = {
        status: round(after.requests.get(status, 0.0) - before.requests.get(status, 0.0))
        for status in after.requests.keys() | before.requests.keys()
    }
    if 0 < delta.get("CANCELLED", 0) <= in_flight:
        run.server_cancelled_at_end = delta.pop("CANCELLED")
    run.server_answers = sum(delta.values())
    run.server_errors = {status: n for status, n in sorted(delta.items()) if status != "OK" and n}
    if run.server_errors:
        errors = sum(run.server_errors.values())
        run.flags.append(f"the server answered {errors} Predict calls with a non-OK status")
    if run.server_answers < generator_answers:
        run.flags.append(
            f"the server counted {run.server_answers} Predict calls, the generator "
            f"{generator_answers} answers"
        )


def _mean_batch(before: ServerCounters, after: ServerCounters, config: Config) -> float | None:
    if config.batching == "off" or after.batch_count <= before.batch_count:
        return None
    return (after.batch_sum - before.batch_sum) / (after.batch_count - before.batch_count)


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


# ---- the runs -----------------------------------------------------------------------------------


def run_rest(
    rest: str, proc: Process, config: Config, rows: int, args: argparse.Namespace, pool: Path
) -> Run:
    """wrk closed loop against ``:predict``; warm-up run first (not counted)."""
    run = Run("REST", len(config.cpus), config.batching, rows, args.rest_connections)
    run.generator = "wrk"
    load = LoadSettings(
        url=f"{rest}/v1/models/{MODEL_NAME}:predict",
        pool=pool,
        cpus=tuple(args.load_cpus),
        timeout_s=CALL_TIMEOUT_S,
    )
    run_closed_loop(load, connections=args.rest_connections, duration_s=args.warmup)
    before = _counters(rest)
    meter = _CpuMeter(proc.pid)
    result = run_closed_loop(load, connections=args.rest_connections, duration_s=args.duration)
    run.server_cpu_cores, machine = meter.cores()
    after = _counters(rest)
    run.load_cpu_cores = result.load_cpu_cores
    run.other_cpu_cores = max(0.0, machine - run.server_cpu_cores - run.load_cpu_cores)
    summary = result.summary
    run.rps = summary.rps * (1 - summary.errors.status / max(1, summary.requests))
    run.predictions_per_s = run.rps * rows
    run.p50_ms = summary.percentiles_ms.get("50")
    run.p99_ms = summary.percentiles_ms.get("99")
    run.latency_mean_ms = summary.latency_avg_ms
    run.latency_sd_ms = summary.latency_stdev_ms
    run.latency_max_ms = summary.latency_max_ms
    run.errors = {k: v for k, v in asdict(summary.errors).items() if v}
    check_server_counts(
        run, before, after, summary.requests - summary.errors.status, run.in_flight
    )
    run.mean_batch_size = _mean_batch(before, after, config)
    return run


def run_grpc(
    grpc_target: str,
    rest: str,
    proc: Process,
    config: Config,
    rows: int,
    args: argparse.Namespace,
    workdir: Path,
) -> Run:
    """One request checked with grpcio, then the generator's closed loop (its warm-up is not
    counted); answers checked against the server's own request counts."""
    run = _grpc_run("gRPC", len(config.cpus), config.batching, rows, args)
    check_predict(grpc_target, grpc_requests(rows)[0], rows)
    before = _counters(rest)
    meter = _CpuMeter(proc.pid)
    load = drive_grpc(grpc_target, rows, args, workdir)
    # The meter spans warm-up and run: both saturate the server, so the rate is the same.
    run.server_cpu_cores, machine = meter.cores()
    after = _counters(rest)
    _take_load(run, load, rows, machine)
    check_server_counts(run, before, after, load.answers, run.in_flight)
    run.mean_batch_size = _mean_batch(before, after, config)
    return run


def _grpc_run(
    protocol: str, server_cpus: int, batching: str, rows: int, args: argparse.Namespace
) -> Run:
    generator: Generator = args.generator
    if generator.kind == "h2load":
        connections, streams = args.grpc_connections, args.grpc_streams
    else:  # one channel (one HTTP/2 connection), every call concurrent on it
        connections, streams = 1, args.grpc_connections * args.grpc_streams
    run = Run(protocol, server_cpus, batching, rows, connections, streams)
    run.generator = generator.label
    return run


def _take_load(run: Run, load: GrpcLoad, rows: int, machine_cores: float) -> None:
    run.rps = load.rps
    run.predictions_per_s = load.rps * rows
    run.take_latency(load)
    run.errors = dict(load.errors)
    run.load_cpu_cores = load.load_cpu_cores
    run.other_cpu_cores = max(0.0, machine_cores - run.server_cpu_cores - run.load_cpu_cores)
    run.flags.extend(load.problems)
    if load.errors:
        run.flags.append(f"the generator counted {sum(load.errors.values())} failed calls")


def ceiling_note(run: Run) -> str:
    """What the ceiling row says: the generator's limit, or the no-op server's when the
    generator had CPU to spare (then its answers per core of its CPU)."""
    if run.load_cpu_cores >= GENERATOR_SATURATED_CORES or run.load_cpu_cores <= 0:
        return "no-op server: the load generator's own limit"
    per_core = run.rps / run.load_cpu_cores
    return (
        f"no-op server: its limit, not the generator's, which used {run.load_cpu_cores:.2f} "
        f"cores (~{per_core:,.0f} answers/s per core of its CPU)"
    )


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
    run = _grpc_run("gRPC ceiling", 1, "off", rows, args)
    target = f"127.0.0.1:{port}"
    try:
        wait_until(
            lambda: "null server ready" in server.log(),
            timeout_s=60,
            what="the no-op gRPC server",
            watch=[server],
        )
        check_predict(target, grpc_requests(rows)[0], None)
        meter = _CpuMeter(server.pid)
        load = drive_grpc(target, rows, args, workdir)
        run.server_cpu_cores, machine = meter.cores()
    finally:
        server.stop()
    _take_load(run, load, rows, machine)
    run.note = ceiling_note(run)
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
    load = drive_grpc(grpc_target, 1, args, workdir)
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
    summary["rps_while_profiled"] = round(load.rps, 1)
    summary["raw"] = str(raw)
    return summary


# ---- the whole benchmark ----------------------------------------------------------------------


def _ms(value: float | None, width: int = 8) -> str:
    """A latency cell: two decimals, ``-`` when the generator does not report it."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return f"{'-':>{width}}"
    return f"{value:>{width}.2f}"


def _table(runs: Sequence[Run]) -> str:
    header = (
        f"{'protocol':<13}{'cores':>6}{'batching':>9}{'rows':>6}{'conn x str':>11}  "
        f"{'generator':<10}{'answers/s':>10}{'pred/s':>11}{'p50 ms':>8}{'p99 ms':>8}"
        f"{'mean ms':>8}{'max ms':>8}{'batch':>7}{'srv CPU':>8}{'gen CPU':>8}{'other':>7}  errors"
    )
    lines = [header, "-" * len(header)]
    for run in runs:
        batch = f"{run.mean_batch_size:.1f}" if run.mean_batch_size else "-"
        errors = {**run.errors, **{f"server {k}": v for k, v in run.server_errors.items()}}
        error_text = ", ".join(f"{k}={v}" for k, v in errors.items()) or "0"
        busy = "*" if run.other_cpu_cores > BUSY_MACHINE_CORES else " "
        shape = f"{run.connections}x{run.streams}"
        lines.append(
            f"{run.protocol:<13}{run.server_cpus:>6}{run.batching:>9}"
            f"{run.rows_per_request:>6}{shape:>11}  {(run.generator or '-').split()[0]:<10}"
            f"{run.rps:>10,.0f}{run.predictions_per_s:>11,.0f}{_ms(run.p50_ms)}{_ms(run.p99_ms)}"
            f"{_ms(run.latency_mean_ms)}{_ms(run.latency_max_ms)}{batch:>7}"
            f"{run.server_cpu_cores:>8.2f}{run.load_cpu_cores:>8.2f}{run.other_cpu_cores:>6.2f}"
            f"{busy}  {error_text}"
            + ("  FLAGGED" if run.flags else "")
            + (f"  ({run.note})" if run.note else "")
        )
    if any(run.other_cpu_cores > BUSY_MACHINE_CORES for run in runs):
        lines.append(
            f"* the rest of the machine used more than {BUSY_MACHINE_CORES} cores during the "
            "run: its figures are lower than on a quiet machine"
        )
    if any(run.generator == "h2load" for run in runs):
        lines.append(
            "h2load reports no latency percentiles (p50/p99 '-'); its mean and max are of every "
            "call in the measured interval"
        )
    for run in runs:
        for flag in run.flags:
            lines.append(
                f"FLAGGED {run.protocol}, {run.server_cpus} core(s), batching {run.batching}, "
                f"{run.rows_per_request} rows: {flag}"
            )
    return "\n".join(lines)


def _goals(runs: Sequence[Run]) -> list[dict[str, Any]]:
    def best(candidates: list[Run], key: str) -> Run | None:
        return max(candidates, key=lambda r: float(getattr(r, key)), default=None)

    trusted = [r for r in runs if not r.flags]
    grpc_one_core = best(
        [
            r
            for r in trusted
            if r.protocol == "gRPC"
            and r.server_cpus == 1
            and r.batching != "off"
            and r.rows_per_request == 1
        ],
        "rps",
    )
    big = best(
        [r for r in trusted if r.rows_per_request == 256 and r.protocol in ("gRPC", "REST")],
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
    """Every configuration and protocol of ``args``; prints the table, writes the JSON.
    Returns 1 if any run was flagged (errors, or answers the server did not count), else 0."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=f"serving-tier-{stamp}-", dir=RESULTS_DIR))
    rest_on, grpc_on = "rest" in args.protocols, "grpc" in args.protocols
    pools = {}
    if rest_on:
        pools = {rows: write_rest_pool(workdir / f"rest-{rows}.jsonl", rows) for rows in args.rows}
    configs = [Config(tuple(args.server_cpus_one), mode) for mode in ("off", "default", "tuned")]
    if not args.one_core_only:
        configs += [Config(tuple(args.server_cpus_two), mode) for mode in ("off", "tuned")]
    runs: list[Run] = []
    profile: dict[str, Any] | None = None
    generator: Generator = args.generator

    def say(message: str) -> None:
        print(f"[serving-tier] {message}", file=sys.stderr, flush=True)

    if grpc_on:
        say(f"gRPC load generator: {generator.describe()}")
        for rows in args.rows:
            say(f"gRPC load generator ceiling, {rows}-row requests")
            runs.append(grpc_ceiling(rows, args, workdir))
    for config in configs:
        say(f"starting the server: {config.label}")
        with serving(config, workdir) as (proc, rest, grpc_target):
            for rows in args.rows:
                if rest_on:
                    say(f"{config.label}: REST, {rows}-row requests")
                    runs.append(run_rest(rest, proc, config, rows, args, pools[rows]))
                if grpc_on:
                    say(f"{config.label}: gRPC, {rows}-row requests")
                    runs.append(run_grpc(grpc_target, rest, proc, config, rows, args, workdir))
            if grpc_on and args.profile and config.batching == "tuned" and len(config.cpus) == 1:
                say(f"{config.label}: profiling the server with py-spy during gRPC saturation")
                profile = profile_server(grpc_target, proc, args, workdir)
    goals = _goals(runs)
    report = {
        "when": stamp,
        "machine": {"cpus": os.cpu_count(), "load_cpus": args.load_cpus},
        "settings": {
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "protocols": args.protocols,
            "rest_connections": args.rest_connections,
            "grpc_connections": args.grpc_connections,
            "grpc_streams_per_connection": args.grpc_streams,
            "grpc_generator": {
                "name": generator.label,
                "description": generator.describe(),
                "fallback": generator.fallback,
                # h2load sends one data file: every gRPC request has the same body.
                "request_bodies": 1 if generator.kind == "h2load" else POOL_REQUESTS,
                "latency_percentiles": generator.kind != "h2load",
            },
            "tuned_batching_parameters": TUNED_BATCHING,
        },
        "runs": [asdict(run) for run in runs],
        "goals": goals,
        "profile": profile,
    }
    out = RESULTS_DIR / f"serving-tier-{stamp}.json"
    out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    if grpc_on:
        print(f"gRPC load generator: {generator.describe()}")
    print(_table(runs))
    print()
    for goal in goals:
        if goal["where"] == "not measured":  # e.g. --rows 1 or --protocols leave it out
            print(f"goal {goal['goal']}: not measured in this run")
            continue
        mark = "held" if goal["held"] else "NOT held"
        print(f"goal {goal['goal']}: {goal['measured']:,} ({goal['where']}) -- {mark}")
    if profile and "self" in profile:
        print("\nserver profile at gRPC saturation (1 core, batching tuned), self time:")
        for name, share in profile["self"][:12]:
            print(f"  {share:6.1%}  {name}")
    print(f"\nresults: {out.relative_to(REPO)} (logs in {workdir.relative_to(REPO)})")
    flagged = sum(1 for run in runs if run.flags)
    if flagged:
        print(f"{flagged} run(s) FLAGGED: see above; they are left out of the goals")
    return 1 if flagged else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.serving_tier",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command")
    gen = sub.add_parser("loadgen", help="(internal) the Python gRPC load generator")
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
    parser.add_argument(
        "--protocols", nargs="+", choices=("rest", "grpc"), default=["rest", "grpc"]
    )
    parser.add_argument("--rest-connections", type=int, default=32)
    parser.add_argument(
        "--grpc-connections", type=int, default=4, help="h2load's -c (HTTP/2 connections)"
    )
    parser.add_argument(
        "--grpc-streams",
        type=int,
        default=8,
        help="h2load's -m, concurrent calls per connection (the Python generator runs "
        "connections x streams calls on one channel)",
    )
    parser.add_argument(
        "--grpc-generator",
        choices=("auto", "h2load", "python"),
        default="auto",
        help="auto: h2load if on PATH, else the Python generator",
    )
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
    try:
        args.generator = choose_generator(args.grpc_generator)
    except SetupError as exc:
        print(exc, file=sys.stderr)
        return 2
    args.server_cpus_one = [cpus[0]]
    args.server_cpus_two = cpus[:2]
    args.load_cpus = [cpus[-1]]
    return benchmark(args)


if __name__ == "__main__":
    sys.exit(main())
