"""What the API's span hooks cost alone: CPU per request of one request's spans, in-process, no I/O.

    python -m bench.tracing_hooks            # a few seconds
    python -m bench.tracing_hooks --requests 20000

`bench.tracing_cost` measures whole processes under load, where a few tens of microseconds drown
in the noise of a busy machine; this isolates the part tracing adds to the API: for each sampling
setting, a fresh process makes the spans of `--requests` model requests as the middleware and the
serving client do (the request from ASGI headers, preprocess, the coalesced call, its attempt with
the trace context for serving, postprocess) and divides its CPU time (`time.process_time`) by
the requests. Nothing is exported during the run (the export thread waits longer than the run):
what is measured is the spans' making, not their encoding. The SDK reads `OTEL_TRACES_SAMPLER`
when the provider is made, hence one process per setting.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Sequence

SETTINGS = {"on, 1 % sampled": "0.01", "on, 100 % sampled": "1.0"}


def one(ratio: str, requests: int) -> float:
    """CPU µs per request of the API's span hooks with `parentbased_traceidratio` at `ratio`."""
    os.environ.update(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",  # never reached: nothing is exported
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": ratio,
            "OTEL_BSP_MAX_QUEUE_SIZE": str(8 * requests),
            "OTEL_BSP_SCHEDULE_DELAY": str(3_600_000),
        }
    )
    from api.observability.tracing import Tracing

    tracing = Tracing()
    tracing.start()
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/fraud/score",
        "headers": [(b"host", b"api"), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 40000),
    }
    started = time.process_time()
    for _ in range(requests):
        request = tracing.start_asgi_span(scope)
        token = tracing.activate(request)
        with tracing.span("preprocess"):
            pass
        with tracing.client.coalesced_call([tracing.client.caller()], {"tfserving.batch_size": 1}):
            with tracing.client.attempt("Predict", {"tfserving.attempt": 1}):
                tracing.with_trace_context(dict)()
        with tracing.span("postprocess"):
            pass
        tracing.deactivate(token)
        tracing.end_server_span(request, 200, "/v1/fraud/score", {"tfserving.request_id": "r"})
    return (time.process_time() - started) / requests * 1e6


def main(argv: Sequence[str] | None = None) -> int:
    """Print µs per request for each setting (one child process each)."""
    p = argparse.ArgumentParser(prog="python -m bench.tracing_hooks", description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=5000)
    p.add_argument("--one", help=argparse.SUPPRESS)  # the child: one sampling ratio
    args = p.parse_args(argv)
    if args.one is not None:
        print(f"{one(args.one, args.requests):.1f}", flush=True)
        os._exit(0)  # the export thread is not waited for: the spans were made, that is the figure
    print("| tracing | API span hooks, CPU/request |\n| --- | --- |")
    for name, ratio in SETTINGS.items():
        out = subprocess.run(
            [sys.executable, "-m", "bench.tracing_hooks", f"--one={ratio}", f"--requests={args.requests}"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        print(f"| {name} | {float(out.stdout.split()[-1]):.1f} µs |")
    print("| off | 0 (no hook runs: `Tracing` is None) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
