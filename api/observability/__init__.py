"""What the API tells about itself: metrics, logs, the event loop's health, score events.

`metrics` (every Prometheus metric of the tier, `ApiMetrics`, and `/metrics`' exposition),
`logging_config` (JSON logs and the access log), `loop_monitor` (event-loop lag and the
callbacks that block it), `events` (one score event per answered model request, written in
the background), and `wiring` (`install_observability`: the parts made for one app, run in
its lifespan).
"""
