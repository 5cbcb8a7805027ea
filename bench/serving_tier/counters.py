"""The server's own Prometheus counters: answers by status and the mean batch size, read before
and after a run to check what the generator saw."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import httpx

from bench.serving_tier.result import Run
from bench.serving_tier.server import Config
from bench.serving_tier.workload import MODEL_NAME

REQUEST_COUNT = ":tensorflow:serving:request_count"
BATCH_SIZE = ":tensorflow:serving:batching_session:processed_batch_size"


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


def counters(rest: str) -> ServerCounters:
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


def mean_batch(before: ServerCounters, after: ServerCounters, config: Config) -> float | None:
    if config.batching == "off" or after.batch_count <= before.batch_count:
        return None
    return (after.batch_sum - before.batch_sum) / (after.batch_count - before.batch_count)
