"""OpenTelemetry tracing for both tiers: whether it is on, and the tracer provider (stdlib at import).

Shared by the API (`api.observability.tracing`) and the model server (`serving.util.tracing`),
which never import each other, as `cpu_quota` is. Everything is configured by OpenTelemetry's
own environment variables (the SDK's, read by the SDK itself where it reads them):

* **on or off.** Off unless the environment asks for an exporter: `OTEL_EXPORTER_OTLP_ENDPOINT`
  or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` set, or `OTEL_TRACES_EXPORTER` naming one (`otlp`,
  `console`). `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` keep it off whatever else
  is set. The SDK's own default would be on, exporting to `localhost:4318`, which in a container
  is almost never a collector: every span would be made, encoded and dropped with a warning.
  Off, nothing of OpenTelemetry is imported (the packages need not be installed: they are the
  `api-tracing` and `serving-tracing` extras) and the request path pays one `is None` test.
* **where spans go.** OTLP over HTTP (`http/protobuf`, the default) or gRPC, from
  `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` / `OTEL_EXPORTER_OTLP_PROTOCOL`; endpoint, headers,
  timeout and compression from the other `OTEL_EXPORTER_OTLP_*` variables.
* **which traces.** `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG` (e.g.
  `parentbased_traceidratio` and `0.01`); the default, `parentbased_always_on`, follows the
  caller's `traceparent` decision and samples every trace it starts.
* **batching of the export.** `OTEL_BSP_*` (at most `OTEL_BSP_MAX_QUEUE_SIZE` spans, 2048, wait in
  memory; more are dropped by the SDK, never blocking a request).
* **who.** `OTEL_SERVICE_NAME` / `OTEL_RESOURCE_ATTRIBUTES`; without them each tier names itself.

`tracer_provider` starts the batch processor's export thread: call it in the process that
serves (a gunicorn worker's lifespan, after the fork), never in a gunicorn master, whose threads
do not survive into the workers it forks.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

#: `OTEL_TRACES_EXPORTER` values this project knows (`none` keeps tracing off).
EXPORTERS: Final = ("otlp", "console")
#: OTLP transports by `OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL` value.
PROTOCOLS: Final = ("http/protobuf", "grpc")


class TracingConfigError(ValueError):
    """The `OTEL_*` variables ask for an exporter or protocol this project cannot export with."""


def tracing_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the `OTEL_*` variables turn tracing on (see the module doc); reads `os.environ` by default."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    if exporter:
        return True
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def check_config(environ: Mapping[str, str] | None = None) -> None:
    """Fail start-up on an exporter or OTLP protocol we cannot serve, before anything is built.

    Raises:
        TracingConfigError: `OTEL_TRACES_EXPORTER` is not `otlp`, `console` or `none` (one
            exporter only), or the OTLP protocol is not `http/protobuf` or `grpc`.
    """
    env = os.environ if environ is None else environ
    exporter = env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    if exporter not in (*EXPORTERS, "none"):
        raise TracingConfigError(f"OTEL_TRACES_EXPORTER={exporter!r}: one of otlp, console, none")
    protocol = _protocol(env)
    if exporter == "otlp" and protocol not in PROTOCOLS:
        choices = ", ".join(PROTOCOLS)
        raise TracingConfigError(f"OTLP protocol {protocol!r} (OTEL_EXPORTER_OTLP_PROTOCOL): one of {choices}")


def _protocol(env: Mapping[str, str]) -> str:
    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    return (protocol or PROTOCOLS[0]).strip()


def tracer_provider(default_service_name: str, environ: Mapping[str, str] | None = None) -> TracerProvider:
    """A new SDK `TracerProvider` exporting as the `OTEL_*` variables say, its batch thread started.

    Not installed as the global provider: each app (several in one test process) owns its own
    and shuts it down (`shutdown()` exports what is queued). The sampler is the SDK's from
    `OTEL_TRACES_SAMPLER`.

    Args:
        default_service_name: `service.name` unless `OTEL_SERVICE_NAME` or
            `OTEL_RESOURCE_ATTRIBUTES` names the service.
        environ: where the exporter, protocol and service name are read (`os.environ` by
            default); the SDK itself reads the sampler, the endpoint, headers and `OTEL_BSP_*`
            from `os.environ` whatever is passed.

    Raises:
        TracingConfigError: as `check_config`.
        ImportError: the tier's tracing extra is not installed.
    """
    env = os.environ if environ is None else environ
    check_config(env)
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

    named = env.get("OTEL_SERVICE_NAME") or "service.name=" in env.get("OTEL_RESOURCE_ATTRIBUTES", "")
    provider = TracerProvider(resource=Resource.create({} if named else {SERVICE_NAME: default_service_name}))
    exporter: SpanExporter
    if env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "console":
        exporter = ConsoleSpanExporter()
    elif _protocol(env) == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        exporter = GrpcExporter()
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

        exporter = HttpExporter()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider
