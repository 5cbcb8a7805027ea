"""What the Open Inference Protocol front costs: the fraud model through its route and through v2.

    python -m bench.oip_cost            # make bench-oip; 3-6 min on 2 cores
    python -m bench.oip_cost --smoke    # well under a minute: the table's shape, not figures
    python -m bench.oip_cost --rate 300 --duration 15 --slo-ms 25

One stack for every setup: a model server with the fraud model and one API process (uvicorn)
with the fraud route and `OIP__MODELS=fraud`, both real processes (`tools.processes`). Three
setups are sent the same transactions (`bench.workload`): the model route (`POST
/v1/fraud/score`, the transaction as JSON: the API extracts the features), v2 JSON (`POST
/v2/models/fraud/infer`, the `features` tensor FP32 [1, 11] as JSON data) and v2 binary (the
same tensor as raw little-endian bytes, the binary tensor data extension, the output asked for
as binary too). For each setup, in turn:

- CPU per request of each tier: `--duration` seconds of open-loop arrivals at `--rate`, the CPU
  time of the API process and of the model server over the run (/proc, as `bench.tracing_cost`
  reads it) divided by the answers. A busy machine slows a run down but leaves the CPU a
  request takes roughly as it is.
- SLO-RPS: the benchmark's own search (`bench.slo.SloSearch` over `bench.load`'s open-loop
  runs, judged by `bench.slo.judge`), its ladder from a closed-loop warm-up, with the quick
  plan's steps (`bench.plan.QUICK`, at most 10 s each), at `--slo-ms` (p99).
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import json
import struct
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from bench.load import LoadSettings, run_closed_loop, run_open_loop
from bench.plan import QUICK, Plan
from bench.procfs import machine_cpu_s, process_cpu_s
from bench.slo import DEFAULT_SLO_MS, SloSearch, judge, schedule_kept
from bench.workload import MODELS_DIR, feature_pool, write_body_pool
from tools.processes import Process, Serving, api_command, free_port, http_ok, start_serving

MODEL = "fraud"
INFER_PATH = f"/v2/models/{MODEL}/infer"
#: The quick plan's search, its steps at most 10 s (quick: 15 s), so the whole run stays within
#: about 6 minutes on 2 cores even where the SLO-RPS is low (3 setups x 8 steps).
# The SLO search as it was measured with: a wider ladder than the quick plan's, which now
# trades rungs for its time budget.
PLAN = dataclasses.replace(QUICK, step_max_s=10.0, ladder_fractions=(0.4, 0.6, 0.75, 0.9, 1.05, 1.2), max_steps=8)
#: --smoke: a plan whose steps are a fraction of a second and whose search is two steps.
SMOKE_PLAN = dataclasses.replace(
    QUICK, warmup_s=0.5, closed_connections=4, step_s=0.5, step_max_s=1.0, min_requests=20, max_steps=2
)


@dataclass(frozen=True)
class Setup:
    """One way of sending the fraud model a transaction: where, and the bodies' pool."""

    name: str
    path: str
    pool: Path
    content_type: str = "application/json"
    headers: tuple[str, ...] = ()


def _v2_json(features: list[float]) -> bytes:
    tensor = {"name": "features", "shape": [1, len(features)], "datatype": "FP32", "data": features}
    return orjson.dumps({"inputs": [tensor]})


def _v2_binary_header(width: int) -> bytes:
    # The same for every body (the data is outside it), so one Inference-Header-Content-Length
    # serves the whole pool.
    data_size = {"binary_data_size": 4 * width}
    tensor = {"name": "features", "shape": [1, width], "datatype": "FP32", "parameters": data_size}
    outputs = [{"name": "fraud_score", "parameters": {"binary_data": True}}]
    return orjson.dumps({"inputs": [tensor], "outputs": outputs})


def setups(where: Path, pool_size: int) -> list[Setup]:
    """The three setups, their pools written under `where` from the same transactions."""
    route = write_body_pool(where / "route.jsonl", pool_size)
    features = feature_pool(pool_size)
    v2 = where / "v2.jsonl"
    v2.write_bytes(b"\n".join(_v2_json(f) for f in features) + b"\n")
    header = _v2_binary_header(len(features[0]))
    binary = where / "v2-binary.b64"
    binary.write_bytes(b"\n".join(base64.b64encode(header + struct.pack(f"<{len(f)}f", *f)) for f in features) + b"\n")
    return [
        Setup("model route (JSON)", "/v1/fraud/score", route),
        Setup("v2 JSON", INFER_PATH, v2),
        Setup(
            "v2 binary",
            INFER_PATH,
            binary,
            "application/octet-stream",
            (f"Inference-Header-Content-Length: {len(header)}",),
        ),  # fmt: skip
    ]


def start_stack(tmp: Path) -> tuple[Serving, Process, str]:
    """Serving with the fraud model and one API process with its route and the OIP front;
    (serving, the API, its base URL) once both are ready."""
    config = tmp / "models.config"
    config.write_text(
        f'model_config_list {{ config {{ name: "{MODEL}" base_path: "{MODELS_DIR / MODEL}" '
        'model_platform: "tensorflow" } }\n'
    )
    serving = start_serving(tmp / "serving.log", model_config_file=config)
    port = free_port()
    env = {
        "SERVING_URL": serving.rest_url,
        "SERVING_GRPC_TARGETS": serving.grpc_target,
        "MODEL_ROUTES": "examples.fraud.route:route",
        "OIP__MODELS": MODEL,
        "OIP__GRPC_PORT": "0",  # REST only here
        "ACCESS_LOG": "false",
    }
    api = Process(api_command(port), tmp / "api.log", env=env)
    try:
        serving.wait_available(MODEL)
        url = f"http://127.0.0.1:{port}"
        api.wait_ready(lambda: http_ok(url + "/readyz"), 60, "/readyz")
    except BaseException:
        api.stop()
        serving.stop()
        raise
    return serving, api, url


def cpu_per_request(
    load: LoadSettings, api: Process, serving: Serving, rate: float, duration: float, seed: int
) -> dict[str, float]:
    """CPU µs per answer of each tier over `duration` s of open-loop arrivals at `rate`."""
    before = (process_cpu_s(api.pid), process_cpu_s(serving.process.pid), *machine_cpu_s())
    run = run_open_loop(load, rate_rps=rate, duration_s=duration, seed=seed)
    after = (process_cpu_s(api.pid), process_cpu_s(serving.process.pid), *machine_cpu_s())
    answered = max(1, run.ok)
    return {
        "api_us": (after[0] - before[0]) / answered * 1e6,
        "serving_us": (after[1] - before[1]) / answered * 1e6,
        "machine_busy": (after[2] - before[2]) / max(1e-9, after[3] - before[3]),
        "answered": float(run.ok),
        "failed": float(run.errors.total),
    }


def slo_rps(load: LoadSettings, plan: Plan, slo_ms: float) -> dict[str, float | None]:
    """One SLO search (ladder from a closed-loop warm-up): the SLO-RPS (None: never met)."""
    closed = run_closed_loop(load, connections=plan.closed_connections, duration_s=plan.warmup_s)
    search = SloSearch(plan.ladder(closed.achieved_rps), plan.tolerance, plan.max_steps, min_rate=plan.min_rate_rps)
    while (step := search.next_step()) is not None:
        rate, phase = step
        run = run_open_loop(
            load, rate_rps=rate, duration_s=plan.step_duration(rate), seed=plan.seed, slo_ms=slo_ms,
            stop_early=phase in ("refine", "confirm"),
        )  # fmt: skip
        kept = schedule_kept(planned=run.planned, sent=run.sent, generator_lag_p99_ms=run.generator_lag_p99_ms,
                             slo_ms=slo_ms)  # fmt: skip
        p99 = run.latency.p99_ms if run.latency else None
        verdict = judge(p99_ms=p99, errors=run.errors.total, schedule_kept=kept, slo_ms=slo_ms, answered=run.ok,
                        late=run.late, planned=run.planned)  # fmt: skip
        print(f"  {rate:,.1f} RPS ({phase}): {verdict.reason or 'meets the SLO'}", file=sys.stderr)
        search.record(rate, verdict.passed)
    return {"closed_rps": closed.achieved_rps, "slo_rps": search.slo_rps}


def run(args: argparse.Namespace) -> dict[str, dict[str, float | None]]:
    """Every setup on one stack, in turn: its CPU per request, then its SLO-RPS."""
    plan = SMOKE_PLAN if args.smoke else PLAN
    figures: dict[str, dict[str, float | None]] = {}
    with tempfile.TemporaryDirectory(prefix="oip-cost-") as tmp:
        where = Path(tmp)
        serving, api, url = start_stack(where)
        try:
            for setup in setups(where, args.pool):
                load = LoadSettings(url=url + setup.path, pool=setup.pool, timeout_s=plan.timeout_s,
                                    content_type=setup.content_type, headers=setup.headers)  # fmt: skip
                print(f"{setup.name}:", file=sys.stderr)
                run_open_loop(load, rate_rps=args.rate, duration_s=args.warmup, seed=plan.seed)  # warm-up
                cpu = cpu_per_request(load, api, serving, args.rate, args.duration, plan.seed)
                figures[setup.name] = {**cpu, **slo_rps(load, plan, args.slo_ms)}
                print(f"  {figures[setup.name]}", file=sys.stderr)
        finally:
            api.stop()
            serving.stop()
    return figures


def markdown(figures: dict[str, dict[str, float | None]], args: argparse.Namespace) -> str:
    """The table: one row per setup."""
    lines = [
        f"fraud model, one API process (uvicorn) and one model server; CPU at {args.rate:g} requests/s "
        f"open loop for {args.duration:g} s; SLO-RPS at p99 <= {args.slo_ms:g} ms"
        + (" (--smoke: not figures)" if args.smoke else "")
        + f" ({time.strftime('%Y-%m-%d')})",
        "",
        "| setup | API CPU/request | serving CPU/request | answered | failed | closed-loop RPS | SLO-RPS "
        "| machine busy |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, f in figures.items():
        slo = f["slo_rps"]
        lines.append(
            f"| {name} | {f['api_us']:.0f} µs | {f['serving_us']:.0f} µs | {f['answered']:.0f} | {f['failed']:.0f} "
            f"| {f['closed_rps']:,.0f} | {'not met' if slo is None else f'{slo:,.0f}'} | {f['machine_busy']:.0%} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run and print the table (Markdown) on stdout, the figures (JSON) and progress on stderr."""
    p = argparse.ArgumentParser(prog="python -m bench.oip_cost", description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=float, default=200.0, help="requests per second of the CPU runs, open loop")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of each CPU run")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds at --rate before each CPU run")
    p.add_argument("--slo-ms", type=float, default=DEFAULT_SLO_MS, help="the SLO-RPS's p99 bound, ms")
    p.add_argument("--pool", type=int, default=512, help="distinct transactions sent")
    p.add_argument("--smoke", action="store_true", help="seconds per setup: checks the run, not figures")
    args = p.parse_args(argv)
    if args.smoke:
        args.rate, args.duration, args.warmup, args.pool = 50.0, 1.0, 0.5, 64
    figures = run(args)
    print(json.dumps(figures), file=sys.stderr)
    print(markdown(figures, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
