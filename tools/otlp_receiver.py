"""A small OTLP trace receiver on loopback, for the tests and the benchmark: what a collector takes.

    with OtlpReceiver() as receiver:                       # OTLP/HTTP on 127.0.0.1:<port>
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_url}
        ...
        spans = receiver.spans()                           # every span received, decoded

It decodes what the SDK's exporters send, `ExportTraceServiceRequest` messages of
`opentelemetry-proto` (opentelemetry/proto/collector/trace/v1/trace_service.proto): over HTTP
(`POST /v1/traces`, `application/x-protobuf`, answered with an `ExportTraceServiceResponse`) and,
with `with_grpc=True`, over gRPC (`opentelemetry.proto.collector.trace.v1.TraceService/Export`).
`keep=False` only counts spans (the benchmark: nothing grows).
"""

from __future__ import annotations

import gzip
import threading
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

__all__ = ["OtlpReceiver", "ReceivedSpan"]

_KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}


def _value(value: AnyValue) -> object:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind is not None else None


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as received: ids in W3C hex ("" for no parent), attributes decoded.

    `service` is the resource's `service.name`; `resource` all its attributes.

    Attributes:
        links: (trace id, span id) of each link.
        status: "UNSET", "OK" or "ERROR".
    """

    service: str
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, object]
    links: tuple[tuple[str, str], ...] = field(default=())
    status: str = "UNSET"
    start_ns: int = 0
    end_ns: int = 0
    resource: dict[str, object] = field(default_factory=dict)


def decode(message: trace_service_pb2.ExportTraceServiceRequest) -> list[ReceivedSpan]:
    """The spans of one export request."""
    out = []
    for resource_spans in message.resource_spans:
        resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
        service = str(resource.get("service.name", ""))
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                out.append(
                    ReceivedSpan(
                        service=service,
                        name=span.name,
                        kind=_KINDS.get(span.kind, str(span.kind)),
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        attributes={kv.key: _value(kv.value) for kv in span.attributes},
                        links=tuple((link.trace_id.hex(), link.span_id.hex()) for link in span.links),
                        status={0: "UNSET", 1: "OK", 2: "ERROR"}.get(span.status.code, "UNSET"),
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        resource=resource,
                    )
                )
    return out


class OtlpReceiver:
    """OTLP/HTTP (and, with `grpc`, OTLP/gRPC) trace receiver on 127.0.0.1, free ports.

    Args:
        with_grpc: also listen for OTLP over gRPC (`grpc_target`).
        keep: keep the decoded spans (`spans`); False only counts them (`count`).
    """

    def __init__(self, *, with_grpc: bool = False, keep: bool = True) -> None:
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []
        self._count = 0
        self._keep = keep
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                receiver.add(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
                answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's name
                return

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._http.serve_forever, name="otlp-http", daemon=True)
        self._grpc: grpc.Server | None = None
        self.grpc_target = ""
        if with_grpc:
            self._grpc = _grpc_server(self)

    @property
    def http_url(self) -> str:
        """`OTEL_EXPORTER_OTLP_ENDPOINT` for OTLP/HTTP (the exporter adds `/v1/traces`)."""
        host, port = self._http.server_address[:2]
        return f"http://{host!s}:{port}"

    def add(self, message: trace_service_pb2.ExportTraceServiceRequest) -> None:
        """Take one export request's spans."""
        spans = decode(message)
        with self._lock:
            self._count += len(spans)
            if self._keep:
                self._spans.extend(spans)

    def spans(self) -> list[ReceivedSpan]:
        """Every span received so far (with `keep`)."""
        with self._lock:
            return list(self._spans)

    def count(self) -> int:
        """How many spans were received so far."""
        with self._lock:
            return self._count

    def start(self) -> OtlpReceiver:
        """Start listening."""
        self._thread.start()
        if self._grpc is not None:
            self._grpc.start()
        return self

    def stop(self) -> None:
        """Stop listening."""
        self._http.shutdown()
        self._http.server_close()
        if self._grpc is not None:
            self._grpc.stop(0)

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _grpc_server(receiver: OtlpReceiver) -> grpc.Server:
    class TraceService(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(  # noqa: N802 - the generated servicer's name
            self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
        ) -> trace_service_pb2.ExportTraceServiceResponse:
            receiver.add(request)
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TraceService(), server)  # type: ignore[no-untyped-call]  # generated, unannotated
    port = server.add_insecure_port("127.0.0.1:0")
    receiver.grpc_target = f"http://127.0.0.1:{port}"
    return server
