"""One serving-tier run's figures (:class:`Run`), as the table and the JSON show them."""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.serving_tier.grpc_load import GrpcLoad


@dataclass
class Run:
    """One saturation run against one server configuration.

    Latencies are milliseconds, as the generator reports them; ``None`` where it does not
    (h2load: no percentiles; bench.loadgen: no minimum or sd)."""

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
