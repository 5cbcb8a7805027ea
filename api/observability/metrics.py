"""Every Prometheus metric of the API tier, and the `/metrics` exposition.

All metrics are defined here, in `ApiMetrics`, and recorded in one place each: request and
stage timings, in-flight requests and serving errors by the middleware
(`api.request.middleware`), event-loop lag and blocks by `api.observability.loop_monitor`,
score events by `api.observability.events`.

| metric | type | labels | what |
|---|---|---|---|
| `api_request_duration_seconds` | histogram | method, route, status | whole request, seconds |
| `api_request_stage_duration_seconds` | histogram | route, stage | per stage, and total |
| `api_requests_in_flight` | gauge | | requests being handled now |
| `api_serving_errors_total` | counter | code | serving-tier failures by canonical code |
| `api_event_loop_lag_seconds` | histogram | | late wake-ups of the loop monitor |
| `api_event_loop_blocks_total` | counter | route | callbacks that blocked the loop too long |
| `api_score_events_total` | counter | outcome | written, dropped_queue_full, dropped_sink_error |
| `api_payload_capture_events_total` | counter | outcome | captured requests/responses: the same outcomes |
| `api_connections_closed_total` | counter | reason | connections the server closed or refused (`ConnectionMetrics`) |
| `api_queue_delay_seconds` | gauge | | per worker, the shortest wait of a request in the last second |
| `api_rollout_request_duration_seconds` | histogram | route, arm, model, version, status | by rollout arm |
| `api_shadow_requests_total` | counter | route, outcome | shadow calls: compared, failed, dropped_* |
| `api_shadow_difference` | histogram | route, field, primary, shadow | a numeric answer field, shadow vs primary |
| `api_shadow_agreements_total` | counter | route, field, primary, shadow, agree | a class-like field equal or not |
| `api_rollout_reloads_total` | counter | outcome | rollout file changes: applied, invalid |

The rollout and shadow rows are `RolloutMetrics`' (`api.rollouts`).

`route` is the route's path template (`/v1/fraud/score`), never the raw path, so the
label's cardinality is bounded; requests that match no route are `<unmatched>`.

Several worker processes (gunicorn). prometheus-client keeps each process's values in
memory, so a scrape would only see the worker that answered it. When the environment
variable `PROMETHEUS_MULTIPROC_DIR` names a directory, prometheus-client's multiprocess
mode writes every process's values to memory-mapped files there and `/metrics` merges
them (`prometheus_client.multiprocess.MultiProcessCollector`). It must be set before
`prometheus_client` is first imported (the library picks in-memory or file-backed values
then, once), and the directory must be empty at start: `gunicorn.conf.py` does both, and
marks dead workers (`child_exit`). Set too late, every scrape would be empty: `ApiMetrics`
refuses to start that way instead. In that mode the
per-process collectors (process_*, python_gc_*) are not exported, as the library
documents. Without the variable (one uvicorn process, tests) each app has its own
registry.
"""

from __future__ import annotations

import os
from typing import Final, TypeVar

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
    multiprocess,
    values,
)
from prometheus_client.metrics import MetricWrapperBase

MULTIPROC_DIR_ENV: Final = "PROMETHEUS_MULTIPROC_DIR"
MetricT = TypeVar("MetricT", bound=MetricWrapperBase)
UNMATCHED_ROUTE: Final = "<unmatched>"

# Latency buckets, seconds: the API's own work is sub-millisecond, a serving call a few
# milliseconds, a timeout seconds.
LATENCY_BUCKETS: Final = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
)  # fmt: skip
# Loop lag: a healthy loop is late by well under a millisecond.
LAG_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


def multiprocess_dir() -> str | None:
    """The multiprocess-mode directory, or None in single-process mode.

    Raises:
        RuntimeError: the variable names a directory but prometheus-client was imported
            before it was set, so this process keeps its values in memory and every scrape
            of the merged files would be empty.
    """
    path = os.environ.get(MULTIPROC_DIR_ENV) or None
    # `values.ValueClass` is chosen once, at prometheus_client's import, from this variable.
    if path is not None and values.ValueClass is values.MutexValue:
        raise RuntimeError(
            f"{MULTIPROC_DIR_ENV} was set after prometheus_client was imported: metrics would stay in "
            "this process and /metrics would be empty; set it before the first import (gunicorn.conf.py does)"
        )
    return path


class ApiMetrics:
    """The API tier's metrics, registered in one registry per app.

    Labelled children are cached by label values: `Histogram.labels()` takes a lock and
    builds a key on every call, which is measurable at several thousand requests per
    second.
    """

    def __init__(self) -> None:
        # The `*_created` companion series (a gauge per labelled child) double the size of
        # a scrape and nothing here reads them. Process-wide, like the library's setting.
        disable_created_metrics()  # type: ignore[no-untyped-call]  # unannotated in prometheus-client
        self.registry = CollectorRegistry()
        reg = self.registry
        if multiprocess_dir() is None:
            ProcessCollector(registry=reg)
            PlatformCollector(registry=reg)
            GCCollector(registry=reg)
        self.request_duration = Histogram(
            "api_request_duration_seconds",
            "Time from the request's arrival to the end of its response, seconds.",
            ("method", "route", "status"),
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.stage_duration = Histogram(
            "api_request_stage_duration_seconds",
            "Time spent per stage of a request (validate, features, serving, total), seconds.",
            ("route", "stage"),
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.in_flight = Gauge(
            "api_requests_in_flight",
            "Requests being handled now.",
            registry=reg,
            multiprocess_mode="livesum",
        )
        self.serving_errors = Counter(
            "api_serving_errors",
            "Serving-tier failures seen by requests, by canonical error code.",
            ("code",),
            registry=reg,
        )
        self.loop_lag = Histogram(
            "api_event_loop_lag_seconds",
            "How late the loop monitor's periodic wake-up ran, seconds.",
            buckets=LAG_BUCKETS,
            registry=reg,
        )
        self.loop_blocks = Counter(
            "api_event_loop_blocks",
            "Callbacks that held the event loop longer than LOOP_BLOCK_THRESHOLD_S, by route.",
            ("route",),
            registry=reg,
        )
        self.score_events = Counter(
            "api_score_events",
            "Score events by outcome: written to the sink, dropped_queue_full, dropped_sink_error.",
            ("outcome",),
            registry=reg,
        )
        self.rollouts = RolloutMetrics(reg)
        self.payload_capture_events = Counter(
            "api_payload_capture_events",
            "Captured request and response events (api.observability.payload_capture) by outcome: "
            "written to the sink, dropped_queue_full, dropped_sink_error.",
            ("outcome",),
            registry=reg,
        )
        self._children: dict[tuple[object, ...], MetricWrapperBase] = {}

    def child(self, metric: MetricT, *labels: str) -> MetricT:
        """`metric.labels(*labels)`, cached."""
        key = (id(metric), *labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found  # type: ignore[return-value]  # keyed by the metric: same type

    def exposition(self) -> tuple[bytes, str]:
        """The text exposition format and its content type, for `GET /metrics`.

        In multiprocess mode this merges every process's files (reads a few small
        files: call it off the event loop).
        """
        path = multiprocess_dir()
        if path is None:
            return generate_latest(self.registry), CONTENT_TYPE_LATEST
        merged = CollectorRegistry()
        multiprocess.MultiProcessCollector(merged, path=path)  # type: ignore[no-untyped-call]  # unannotated upstream
        return generate_latest(merged), CONTENT_TYPE_LATEST


# Differences between a shadow's and the primary's answers: from float32 noise to a flip.
DIFFERENCE_BUCKETS: Final = (1e-7, 1e-6, 1e-5, 1e-4, 0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0)


class RolloutMetrics:
    """The rollouts' metrics (`api.rollouts`), in the app's registry.

    Labels are bounded by the deployment, never by clients: `arm` is stable, canary, pinned or
    shadow; `model` and `version` are what served (a pinned version is one serving has AVAILABLE:
    a request for one it does not have fails before anything is recorded under it); `primary`
    and `shadow` are `model:version` pairs; `field` a response field of the route's schema.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.request_duration = Histogram(
            "api_rollout_request_duration_seconds",
            "Model requests by rollout arm and the model version that answered, seconds (status 5xx: failed).",
            ("route", "arm", "model", "version", "status"),
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.shadow_requests = Counter(
            "api_shadow_requests",
            "Shadow calls by outcome: compared, failed, dropped_queue_full, dropped_saturated, "
            "dropped_deadline, dropped_shutdown.",
            ("route", "outcome"),
            registry=registry,
        )
        self.shadow_difference = Histogram(
            "api_shadow_difference",
            "Absolute difference of a numeric response field, shadow vs primary (the largest over a list).",
            ("route", "field", "primary", "shadow"),
            buckets=DIFFERENCE_BUCKETS,
            registry=registry,
        )
        self.shadow_agreements = Counter(
            "api_shadow_agreements",
            "A class-like response field (bool, int, str) of the shadow equal to the primary's (agree=true) or not.",
            ("route", "field", "primary", "shadow", "agree"),
            registry=registry,
        )
        self.reloads = Counter(
            "api_rollout_reloads",
            "Rollout file changes seen by this worker: applied, or invalid (the previous rollouts stay).",
            ("outcome",),
            registry=registry,
        )


class ConnectionMetrics:
    """Metrics of the HTTP server layer (`api.http_server`), below the app.

    Recorded by each worker's connection registry, in its own registry: under gunicorn
    (multiprocess mode) they are merged into `/metrics` with the app's; a single uvicorn
    process does not export them.

    Reasons: `header_too_large` (431), `request_line_too_long` (414), `header_timeout`
    (408), `missing_host` (400), `queue_delay` (503: waited too long, admission) and
    `in_flight` (503: at `MAX_IN_FLIGHT_REQUESTS`, refused from the head) -- these two are
    counted per refusal, also when the refused request's small body was read and its
    connection stays open --, `evicted`
    (idle, closed to make room at `worker_connections`), `refused_at_limit` (at
    `worker_connections` with none idle), `unread_answers`, `write_stalled` and
    `pipelined_too_deep` (closed without an answer: a client that does not read).

    `api_queue_delay_seconds` (per worker, the largest of the live workers' when merged):
    the shortest time a request of the last second waited between reaching the host and
    its head being read, the accept queue included; what an autoscaler follows
    (`docs/scaling.md`).
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.connections_closed = Counter(
            "api_connections_closed",
            "Client connections the server closed or refused, by reason.",
            ("reason",),
            registry=self.registry,
        )
        self.queue_delay = Gauge(
            "api_queue_delay_seconds",
            "Shortest wait of a request in the last second, from reaching the host to its head "
            "being read (the accept queue included), seconds.",
            registry=self.registry,
            multiprocess_mode="livemax",
        )
        # The labelled child per reason: `labels()` takes a lock and builds a key each time,
        # a sixth of a refusal's Python (`api.http_server.shed_answers`).
        self._closed_by_reason: dict[str, Counter] = {}

    def closed(self, reason: str) -> None:
        """Count one connection closed for `reason`."""
        child = self._closed_by_reason.get(reason)
        if child is None:
            child = self._closed_by_reason[reason] = self.connections_closed.labels(reason)
        child.inc()

    def value(self, reason: str) -> float:
        """How many were closed for `reason` in this process (for tests and logs)."""
        return self.registry.get_sample_value("api_connections_closed_total", {"reason": reason}) or 0.0
