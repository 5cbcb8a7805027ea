"""`python -m bench.serving_tier`: the serving tier alone (see the package docstring)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.processes import REPO, SetupError
from bench.serving_tier import __doc__ as PACKAGE_DOC
from bench.serving_tier.grpc_load import Generator, choose_generator
from bench.serving_tier.grpc_loadgen import drive, null_server
from bench.serving_tier.neighbour import NeighbourRun, largest_request, neighbour_lines, run_neighbour
from bench.serving_tier.report import goals, table
from bench.serving_tier.result import Run
from bench.serving_tier.runs import grpc_ceiling, profile_server, run_grpc, run_rest
from bench.serving_tier.server import TUNED_BATCHING, Config, serving
from bench.serving_tier.workload import POOL_REQUESTS, feature_rows, write_rest_pool
from serving.model_servers.flags import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_REQUEST_ELEMENTS, ServerOptions

RESULTS_DIR = REPO / "bench" / "results"


def benchmark(args: argparse.Namespace) -> int:
    """Every configuration and protocol of ``args``; prints the table, writes the JSON.
    Returns 1 if any run was flagged (errors, or answers the server did not count), else 0."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=f"serving-tier-{stamp}-", dir=RESULTS_DIR))
    rest_on, grpc_on = "rest" in args.protocols, "grpc" in args.protocols
    pools = {}
    if rest_on and not args.neighbour_only:
        pools = {rows: write_rest_pool(workdir / f"rest-{rows}.jsonl", rows) for rows in args.rows}
    configs = [Config(tuple(args.server_cpus_one), mode) for mode in ("off", "default", "tuned")]
    if not args.one_core_only:
        configs += [Config(tuple(args.server_cpus_two), mode) for mode in ("off", "tuned")]
    if args.neighbour_only:
        configs, grpc_on = [], False
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
    neighbour: NeighbourRun | None = None
    if rest_on and args.neighbour_rate > 0:
        # The largest body the server's default limits allow, from the same rows as the pools.
        body, rows = largest_request(
            feature_rows(256), DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_REQUEST_ELEMENTS
        )
        cpus = tuple(args.server_cpus_one if args.one_core_only else args.server_cpus_two)
        json_processes = args.neighbour_json_processes
        if json_processes is None:
            json_processes = ServerOptions().rest_api_num_json_processes  # the server's default
        config = Config(cpus, "off", (f"--rest_api_num_json_processes={json_processes}",))
        say(f"starting the server: {config.label} (hostile neighbour)")
        with serving(config, workdir) as (_, rest, _):
            pool = pools.get(1) or write_rest_pool(workdir / "rest-1.jsonl", 1)
            neighbour = run_neighbour(
                rest,
                pool,
                body,
                rows,
                rate_rps=args.neighbour_rate,
                duration_s=args.duration,
                warmup_s=args.warmup,
                load_cpus=tuple(args.load_cpus),
                server=config.label,
                say=say,
            )
    found = goals(runs)
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
        "goals": found,
        "profile": profile,
        "hostile_neighbour": asdict(neighbour) if neighbour is not None else None,
    }
    out = RESULTS_DIR / f"serving-tier-{stamp}.json"
    out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    if grpc_on:
        print(f"gRPC load generator: {generator.describe()}")
    if runs:  # none with --neighbour-only
        print(table(runs))
        print()
        for goal in found:
            if goal["where"] == "not measured":  # e.g. --rows 1 or --protocols leave it out
                print(f"goal {goal['goal']}: not measured in this run")
                continue
            mark = "held" if goal["held"] else "NOT held"
            print(f"goal {goal['goal']}: {goal['measured']:,} ({goal['where']}) -- {mark}")
        print()
    if neighbour is not None:
        print("\n".join(neighbour_lines(neighbour)))
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
        description=PACKAGE_DOC,
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
        "--neighbour-rate",
        type=float,
        default=500.0,
        help="the well-behaved client's requests/s in the hostile-neighbour row (0: skip the row)",
    )
    parser.add_argument(
        "--neighbour-json-processes",
        type=int,
        default=None,
        help="the server's --rest_api_num_json_processes in the hostile-neighbour row (default: "
        "the server's own default; 0 decodes large bodies on its request threads)",
    )
    parser.add_argument(
        "--neighbour-only",
        action="store_true",
        help="only the hostile-neighbour row (REST), none of the matrix",
    )
    parser.add_argument(
        "--profile", action="store_true", help="py-spy the 1-core tuned-batching server"
    )
    args = parser.parse_args(argv)
    if args.command == "loadgen":
        result = asyncio.run(
            drive(args.target, args.rows, args.concurrency, args.duration, args.warmup)
        )
        print(json.dumps(result))
        return 0
    if args.command == "null-server":
        null_server(args.port)
        return 0
    if args.quick:
        args.duration, args.warmup = 5.0, 1.0
    if args.neighbour_only and (args.neighbour_rate <= 0 or "rest" not in args.protocols):
        parser.error("--neighbour-only needs the REST protocol and a --neighbour-rate above 0")
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
