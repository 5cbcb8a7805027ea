"""The gRPC load, whichever generator drives it (h2load, or the Python fallback), and the one
call checked with grpcio before a run."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.processes import REPO, SetupError, taskset
from bench.serving_tier.h2load import (
    H2LOAD_INSTALL_HINT,
    H2loadSummary,
    h2load_command,
    h2load_info,
    parse_h2load,
    run_tool,
)
from bench.serving_tier.workload import (
    GRPC_PREFIX,
    OUTPUT_NAME,
    PREDICT_METHOD,
    grpc_requests,
    write_grpc_body,
)


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
        text, cpu = run_tool(command(args.duration, args.warmup), timeout_s)
    else:  # an h2load older than --warm-up-time: a separate run first, not counted
        run_tool(command(args.warmup, 0.0), timeout_s)
        text, cpu = run_tool(command(args.duration, 0.0), timeout_s)
    (workdir / f"h2load-{rows}-{time.monotonic_ns()}.txt").write_text(text)
    return h2load_load(parse_h2load(text), args.duration, cpu)


def _run_python_loadgen(target: str, rows: int, args: argparse.Namespace) -> GrpcLoad:
    command = [
        *taskset(args.load_cpus),
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


