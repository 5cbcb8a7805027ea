"""The runs: REST and gRPC saturation against one server configuration, the gRPC generator's
ceiling against the no-op server, and py-spy of the server under gRPC load."""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.load import LoadSettings, run_closed_loop
from bench.processes import taskset
from bench.procfs import CpuMeter, process_tree
from bench.serving_tier.counters import check_server_counts, counters, mean_batch
from bench.serving_tier.grpc_load import Generator, GrpcLoad, check_predict, drive_grpc
from bench.serving_tier.result import Run
from bench.serving_tier.server import Config
from bench.serving_tier.workload import CALL_TIMEOUT_S, MODEL_NAME, grpc_requests
from tools.processes import Process, free_port, wait_until

#: A generator using less of its CPU than this (cores) was not what limited a run.
GENERATOR_SATURATED_CORES = 0.9


def run_rest(
    rest: str, proc: Process, config: Config, rows: int, args: argparse.Namespace, pool: Path
) -> Run:
    """A closed loop (``bench.loadgen``) against ``:predict``; a warm-up run first (not
    counted); answers checked against the server's own request counts."""
    run = Run("REST", len(config.cpus), config.batching, rows, args.rest_connections)
    run.generator = "bench.loadgen"
    load = LoadSettings(
        url=f"{rest}/v1/models/{MODEL_NAME}:predict",
        pool=pool,
        cpus=tuple(args.load_cpus),
        timeout_s=CALL_TIMEOUT_S,
    )
    run_closed_loop(load, connections=args.rest_connections, duration_s=args.warmup)
    before = counters(rest)
    meter = CpuMeter(process_tree([proc.pid]))
    result = run_closed_loop(load, connections=args.rest_connections, duration_s=args.duration)
    reading = meter.read()
    after = counters(rest)
    run.server_cpu_cores = reading.cores
    run.load_cpu_cores = result.load_cpu_cores
    run.other_cpu_cores = max(0.0, reading.machine_cores - run.server_cpu_cores - run.load_cpu_cores)
    run.rps = result.achieved_rps
    run.predictions_per_s = run.rps * rows
    if result.latency is not None:
        run.p50_ms = result.latency.p50_ms
        run.p99_ms = result.latency.p99_ms
        run.latency_mean_ms = result.latency.avg_ms
        run.latency_max_ms = result.latency.max_ms
    run.errors = {k: v for k, v in asdict(result.errors).items() if v}
    check_server_counts(run, before, after, result.ok, run.in_flight)
    run.mean_batch_size = mean_batch(before, after, config)
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
    before = counters(rest)
    meter = CpuMeter(process_tree([proc.pid]))
    load = drive_grpc(grpc_target, rows, args, workdir)
    # The meter spans warm-up and run: both saturate the server, so the rate is the same.
    reading = meter.read()
    run.server_cpu_cores = reading.cores
    after = counters(rest)
    _take_load(run, load, rows, reading.machine_cores)
    check_server_counts(run, before, after, load.answers, run.in_flight)
    run.mean_batch_size = mean_batch(before, after, config)
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
        [
            *taskset(args.server_cpus_one),
            sys.executable,
            "-m",
            "bench.serving_tier",
            "null-server",
            f"--port={port}",
        ],
        workdir / f"null-grpc-{rows}.log",
        name="null-grpc",
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
        meter = CpuMeter(process_tree([server.pid]))
        load = drive_grpc(target, rows, args, workdir)
        reading = meter.read()
        run.server_cpu_cores, machine = reading.cores, reading.machine_cores
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
            *taskset(args.load_cpus),
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


