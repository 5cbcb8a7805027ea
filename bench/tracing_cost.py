"""What tracing costs: CPU per request of each tier with tracing off, on at 1 % and on at 100 % sampling.

    python -m bench.tracing_cost                      # make bench-tracing; ~2 min on 2 cores
    python -m bench.tracing_cost --rate 300 --duration 15 --rounds 3 --protocol grpc

For each setting the fraud route is served by a fresh model server and a fresh API (one uvicorn
process), both exporting to an OTLP/HTTP receiver on loopback that only counts what it gets
(`tools.otlp_receiver`), and is sent `--duration` seconds of open-loop arrivals at `--rate`
(`bench.loadgen`, the bodies of `bench.workload`) after a warm-up. The figure is CPU time --
user + system, from /proc/PID/stat (`bench.procfs`), the kernel's own accounting -- of the API
process and of the model server over the run, divided by the answers: a busy machine slows the
run down but leaves the CPU a request takes roughly as it is, which wall-clock figures would not.
The settings run in turn, `--rounds` times, and the median of the rounds is reported, with the
machine's CPU load beside it. Tracing on means `OTEL_EXPORTER_OTLP_ENDPOINT` set, with
`OTEL_TRACES_SAMPLER=parentbased_traceidratio` and `OTEL_TRACES_SAMPLER_ARG` 0.01 or 1.0 (the
requests carry no `traceparent`: the API decides).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench.procfs import machine_cpu_s, process_cpu_s
from bench.workload import MODELS_DIR, write_body_pool
from tools.otlp_receiver import OtlpReceiver
from tools.processes import Process, api_command, free_port, http_ok, start_serving

EXPORT_MS = 1000
SETTINGS: dict[str, dict[str, str]] = {
    "off": {},
    "on, 1 % sampled": {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.01"},
    "on, 100 % sampled": {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1.0"},
}


def _load(url: str, pool: Path, rate: float, duration: float) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-m", "bench.loadgen", "--open", f"--url={url}", f"--pool={pool}",
         f"--rate={rate}", f"--duration={duration}", "--timeout=5"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    result: dict[str, object] = json.loads(out.stdout)
    return result


def measure(
    name: str, env: dict[str, str], args: argparse.Namespace, tmp: Path, receiver: OtlpReceiver
) -> dict[str, float]:
    """One setting: fresh serving and API, warm-up, then CPU seconds per answer of each tier."""
    # Export once a second (the SDK's default is every 5 s), so the run's spans are exported, and
    # their export counted, within the second after the load ends.
    tracing = {**env, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_url, "OTEL_BSP_SCHEDULE_DELAY": str(EXPORT_MS)}
    tracing = tracing if name != "off" else {}
    config = tmp / "models.config"
    config.write_text(
        'model_config_list { config { name: "fraud" base_path: "%s" model_platform: "tensorflow" } }\n'
        % (MODELS_DIR / "fraud")
    )
    serving = start_serving(tmp / "serving.log", env=tracing, model_config_file=config)
    api_port = free_port()
    api_env = {
        "SERVING_URL": serving.rest_url,
        "SERVING_PROTOCOL": args.protocol,
        "SERVING_GRPC_TARGETS": serving.grpc_target,
        "MODEL_ROUTES": "examples.fraud.route:route",
        "ACCESS_LOG": "false",
        **tracing,
    }
    api = Process(api_command(api_port), tmp / "api.log", env=api_env)
    try:
        serving.wait_available("fraud")
        url = f"http://127.0.0.1:{api_port}"
        api.wait_ready(lambda: http_ok(url + "/readyz"), 60, "/readyz")
        pool = write_body_pool(tmp / "pool.jsonl")
        _load(url + "/v1/fraud/score", pool, args.rate, 2.0)  # warm-up
        time.sleep(1.5 * EXPORT_MS / 1000)  # the warm-up's spans exported before the measured run
        spans = receiver.count()
        before = (process_cpu_s(api.pid), process_cpu_s(serving.process.pid), *machine_cpu_s())
        result = _load(url + "/v1/fraud/score", pool, args.rate, args.duration)
        time.sleep(1.5 * EXPORT_MS / 1000)  # the last export of the run's spans (same wait when off)
        after = (process_cpu_s(api.pid), process_cpu_s(serving.process.pid), *machine_cpu_s())
        answered = float(result["ok"])  # type: ignore[arg-type]
        if answered <= 0:
            raise RuntimeError(f"{name}: no request answered: {result}")
        return {
            "api_us": (after[0] - before[0]) / answered * 1e6,
            "serving_us": (after[1] - before[1]) / answered * 1e6,
            "machine_busy": (after[2] - before[2]) / max(1e-9, after[3] - before[3]),
            "answered": answered,
            "spans_per_request": (receiver.count() - spans) / answered,
        }
    finally:
        api.stop()
        serving.stop()


def run(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Every setting `args.rounds` times, in turn; the median of each figure per setting."""
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in SETTINGS}
    with OtlpReceiver(keep=False) as receiver, tempfile.TemporaryDirectory(prefix="tracing-cost-") as tmp:
        for round_number in range(args.rounds):
            for name, env in SETTINGS.items():
                where = Path(tmp) / f"{round_number}-{name.replace(' ', '').replace('%', 'pc').replace(',', '')}"
                where.mkdir()
                rounds[name].append(measure(name, env, args, where, receiver))
                print(f"round {round_number + 1}, {name}: {rounds[name][-1]}", file=sys.stderr)
    return {name: {key: statistics.median(r[key] for r in runs) for key in runs[0]} for name, runs in rounds.items()}


def markdown(figures: dict[str, dict[str, float]], args: argparse.Namespace) -> str:
    """The table the docs quote."""
    off = figures["off"]
    lines = [
        f"CPU per request, fraud route, {args.protocol.upper()} to serving, {args.rate:g} requests/s open loop, "
        f"{args.duration:g} s, median of {args.rounds} rounds ({time.strftime('%Y-%m-%d')})",
        "",
        "| tracing | API CPU/request | vs off | serving CPU/request | vs off | spans/request | machine busy |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, f in figures.items():
        lines.append(
            f"| {name} | {f['api_us']:.0f} µs | {f['api_us'] - off['api_us']:+.0f} µs | {f['serving_us']:.0f} µs "
            f"| {f['serving_us'] - off['serving_us']:+.0f} µs | {f['spans_per_request']:.2f} "
            f"| {f['machine_busy']:.0%} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run and print the table (Markdown) and the figures (JSON, on stderr)."""
    p = argparse.ArgumentParser(prog="python -m bench.tracing_cost", description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=float, default=200.0, help="requests per second, open loop")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of measured load per setting")
    p.add_argument("--rounds", type=int, default=2, help="times each setting runs (median reported)")
    p.add_argument("--protocol", choices=("rest", "grpc"), default="rest", help="the API's transport to serving")
    args = p.parse_args(argv)
    figures = run(args)
    print(json.dumps(figures), file=sys.stderr)
    print(markdown(figures, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
