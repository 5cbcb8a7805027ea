"""``python -m serving`` on the example models (``models/fraud``, ``models/digits``), for the tests
that attack it: one real process on 127.0.0.1 with free ports, its Prometheus page on, readiness
polled, SIGTERM at the end."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
from tensorflow_serving.apis import prediction_service_pb2_grpc

from tests.support import Process, Serving, start_example_serving

METRICS_PATH = "/monitoring/prometheus/metrics"
RPC_TIMEOUT_S = 10.0
#: One fraud request row (11 features, api.features order) and one digits image (8x8x1, 0..16).
FRAUD_ROW = [120.0, 1.2, 0.0, 35.5, 13.0, 0.0, 1.0, 0.0, 2.0, 400.0, 1.0]
DIGIT_IMAGE = [[[float((r * 8 + c) % 17)] for c in range(8)] for r in range(8)]


@dataclass
class ExampleServer:
    serving: Serving
    rest: httpx.Client
    channel: grpc.Channel
    stub: prediction_service_pb2_grpc.PredictionServiceStub

    @property
    def proc(self) -> Process:
        return self.serving.process

    @property
    def pid(self) -> int:
        return self.serving.process.pid

    @property
    def rest_port(self) -> int:
        return self.serving.rest_port

    def rss_bytes(self) -> int:
        """The server's resident set size now (``/proc/<pid>/statm``)."""
        pages = int(Path(f"/proc/{self.pid}/statm").read_text().split()[1])
        return pages * 4096

    def limit_counts(self) -> dict[tuple[str, str], float]:
        """``request_limit_exceeded_count`` by (entrypoint, reason), from the metrics page."""
        page = self.rest.get(METRICS_PATH).text
        pattern = r'request_limit_exceeded_count\{entrypoint="(\w+)",reason="(\w+)"\} (\S+)'
        return {(e, r): float(v) for e, r, v in re.findall(pattern, page)}


@contextlib.contextmanager
def running_example_server(workdir: Path, **flags: object) -> Iterator[ExampleServer]:
    """The example models served with ``flags`` added (TF Serving's flag names, as
    ``tools.processes.serving_command`` takes them); the metrics page at :data:`METRICS_PATH`."""
    monitoring = workdir / "monitoring.config"
    monitoring.write_text(f'prometheus_config {{ enable: true path: "{METRICS_PATH}" }}\n')
    serving = start_example_serving(
        workdir,
        monitoring_config_file=monitoring,
        tensorflow_intra_op_parallelism=1,
        tensorflow_inter_op_parallelism=1,
        **flags,
    )
    rest = httpx.Client(base_url=serving.rest_url, timeout=RPC_TIMEOUT_S)
    channel = grpc.insecure_channel(serving.grpc_target, options=[("grpc.max_receive_message_length", 64 << 20)])
    try:
        serving.wait_available("fraud", "digits")
        grpc.channel_ready_future(channel).result(timeout=RPC_TIMEOUT_S)
        yield ExampleServer(serving, rest, channel, prediction_service_pb2_grpc.PredictionServiceStub(channel))
    finally:
        channel.close()
        rest.close()
        serving.stop()
