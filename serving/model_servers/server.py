"""The server: :func:`build` makes the object graph from the flags, :meth:`ModelServer.run` runs it.

TF Serving's ``Server::BuildAndStart`` and ``WaitForTermination`` (``model_servers/server.cc``),
in two halves:

* **build** (:func:`build`, the composition root) -- reads the config files the flags name, logs
  the Session thread-pool sizes and the flags accepted but not implemented yet, builds the loader
  (SavedModel + metrics + warmup), the manager, the Session (direct or batching), the cores
  (:class:`~serving.servables.tensorflow.predict_impl.Predictor`,
  :class:`~serving.servables.tensorflow.inference_runner.InferenceRunner`) wrapped in what records
  their metrics, and the front ends; applies the config (:meth:`ServableManager.aspire
  <serving.core.manager.ServableManager.aspire>`: labels checked, each model's version directories
  read, its aspired versions ``START``) and binds the REST socket and the gRPC port, so a busy port
  fails here, before any model is loaded. Nothing runs yet.
* **run** (:meth:`ModelServer.run`) -- starts the front ends (status answers ``START``/``LOADING``
  until a version is ``AVAILABLE`` -- the API's readiness check polls ``GET /v1/models/{name}`` --
  and predictions get ``Servable not found``), then the manager (loads with warmup, retries, the
  file-system poll, the ``--model_config_file_poll_wait_seconds`` reloads) and logs which versions
  are available once the initial loads are done; waits for a signal; drains and shuts down.

The front ends (:class:`FrontEnd`: REST on uvicorn, gRPC on ``grpc.aio``) run as tasks on one
asyncio loop. Signals are owned here, not by uvicorn: on SIGTERM/SIGINT every front end stops
accepting and finishes its in-flight requests, loading stops after the current version, the
versions are unloaded, and :func:`run` returns 0. A second signal forces the exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from otel_tracing import check_config, tracing_enabled
from serving.batching.batching_options import BatchingOptions
from serving.batching.batching_session import BatchingSession
from serving.config.model_server_config import ModelServerConfig
from serving.config.monitoring_config import prometheus_path
from serving.core.manager import ServableManager
from serving.model_servers import flags
from serving.model_servers.config_reloader import ModelConfigFilePoller
from serving.model_servers.flags import ServerOptions
from serving.model_servers.grpc_server import GrpcServer
from serving.model_servers.http_server import RestServer, bind, bind_unix, create_app, json_processes
from serving.model_servers.model_service_impl import ModelService
from serving.model_servers.prediction_service_impl import PredictionService
from serving.model_servers.server_config import batching_options
from serving.servables.tensorflow import saved_model_warmup as warmup
from serving.servables.tensorflow.inference_runner import InferenceRunner
from serving.servables.tensorflow.monitored import (
    MonitoredInference,
    MonitoredPredictor,
    MonitoredSession,
    instrument_loader,
)
from serving.servables.tensorflow.predict_impl import Predictor
from serving.servables.tensorflow.servable import Servable
from serving.servables.tensorflow.serving_session import DirectSession, Session
from serving.util.errors import Code, LimitExceeded, ServingError
from serving.util.executor import BlockingExecutor
from serving.util.metrics import ServingMetrics

if TYPE_CHECKING:
    from serving.util.tracing import ServingTracing

__all__ = ["FrontEnd", "ModelServer", "build", "run", "serve"]

_log = logging.getLogger(__name__)


def run(options: ServerOptions, config: ModelServerConfig) -> int:
    """Serve until a signal arrives, on a new event loop; return the process exit code.

    Raises :class:`~serving.util.errors.ServingError` for start-up failures (e.g. the REST port is
    taken).
    """
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return asyncio.run(serve(options, config))
    # uvloop serves HTTP faster; grpc.aio runs on it too (its poller wakes the loop thread-safely).
    return uvloop.run(serve(options, config))


async def serve(options: ServerOptions, config: ModelServerConfig) -> int:
    """The server's whole life inside the running event loop: :func:`build`, then run it."""
    return await build(options, config).run()


@dataclass
class ModelServer:
    """One model server as :func:`build` makes it: bound, configured, not yet running."""

    manager: ServableManager
    front_ends: list[FrontEnd]
    load_executor: BlockingExecutor
    """Waits on the manager (initial load, config reloads, unloading) off the event loop."""
    config_poller: ModelConfigFilePoller | None
    """``--model_config_file_poll_wait_seconds``; ``None`` when off."""
    executors: list[BlockingExecutor]
    """The request and batch thread pools, shut down last."""
    tracing: ServingTracing | None = None
    """The tracer provider when the ``OTEL_*`` variables turn tracing on; its spans are exported
    before the process ends."""

    async def run(self) -> int:
        """Start, serve until a signal (or a front end stops), drain, shut down.

        Returns the exit code: 0 after a signal, 1 when a front end stopped by itself.
        """
        manager, load_executor, config_poller = self.manager, self.load_executor, self.config_poller
        stop = asyncio.Event()
        with _signals_set(stop, self.front_ends):
            for front_end in self.front_ends:
                await front_end.start()
            loading = asyncio.ensure_future(load_executor.run(manager.load_aspired))
            loading.add_done_callback(functools.partial(_log_loaded, manager))
            loading.add_done_callback(_freeze_heap)
            if config_poller is not None:
                config_poller.start()
            stopped = asyncio.ensure_future(stop.wait())
            waiters: list[asyncio.Future[Any]] = [stopped]
            waiters += [fe.task for fe in self.front_ends if fe.task is not None]
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            crashed = not stop.is_set()
            stopped.cancel()
            _log.info("Shutting down: draining in-flight requests")
            if config_poller is not None:
                config_poller.stop(timeout_s=0)  # no new reloads; one under way ends below
            manager.stop_loading()
            for front_end in self.front_ends:
                await front_end.stop()
            with contextlib.suppress(Exception):
                await loading
            if config_poller is not None:
                await load_executor.run(config_poller.stop)
            await load_executor.run(manager.unload_all, 30.0)
        for executor in self.executors:
            executor.shutdown()
        load_executor.shutdown()
        if self.tracing is not None:
            self.tracing.shutdown()
        _log.info("Server stopped")
        return 1 if crashed else 0


def build(options: ServerOptions, config: ModelServerConfig) -> ModelServer:
    """The composition root: every object of the server, from the flags and the model config.

    Call it on the running event loop (the gRPC server binds to it). Raises
    :class:`~serving.util.errors.ServingError` for a bad config file (batching parameters,
    monitoring config, SSL config), a refused model config, or a port already in use.
    """
    # The other config files first: a bad one fails start-up before anything is loaded.
    batching = batching_options(options)
    metrics_path = prometheus_path(options.monitoring_config_file)
    metrics = ServingMetrics()
    tracing = load_tracing()
    manager = ServableManager(
        _loader(options, metrics),
        allow_version_labels_for_unavailable_models=(
            options.allow_version_labels_for_unavailable_models
        ),
        file_system_poll_wait_seconds=options.file_system_poll_wait_seconds,
        max_num_load_retries=options.max_num_load_retries,
        load_retry_interval_s=max(0, options.load_retry_interval_micros) / 1e6,
        num_load_threads=options.num_load_threads,
    )
    manager.aspire(config)
    config_poller = None
    if options.model_config_file and options.model_config_file_poll_wait_seconds > 0:
        config_poller = ModelConfigFilePoller(
            options.model_config_file, manager, options.model_config_file_poll_wait_seconds
        )
    request_executor = BlockingExecutor(flags.rest_api_num_threads(options), "session-run")
    # Two, so a reload is not queued behind the initial load; the loads themselves run on the
    # manager's own threads.
    load_executor = BlockingExecutor(2, "servable-load")
    executors = [request_executor]
    session: Session = DirectSession(
        request_executor, inline_below_s=options.session_run_inline_below_us / 1e6, tracing=tracing
    )
    if batching is not None:
        session, batch_executor = _batching_session(batching, metrics, tracing)
        executors.append(batch_executor)
    # Each core API runs through the same (batching or direct) Session, wrapped per API in what
    # TF Serving records per Session run (runtime_latency, or MultiInference's example counts).
    predictor = Predictor(
        manager, request_executor, session=MonitoredSession(session, metrics, api="Predict")
    )
    inference = InferenceRunner(
        manager,
        request_executor,
        session_for=functools.partial(_monitored_session, session, metrics),
        method_name_check=options.enable_signature_method_name_check,
    )

    limits = flags.request_limits(options)
    front_ends: list[FrontEnd] = []
    if options.rest_api_port:
        if metrics_path is not None:
            _log.info("Exporting Prometheus metrics at %s on the REST port", metrics_path)
        # Large JSON bodies are decoded in low-priority processes (http_rest_api_handler).
        json_pool = json_processes(
            options.rest_api_num_json_processes, options.rest_api_json_process_timeout_in_ms
        )
        app = create_app(
            MonitoredPredictor(predictor, metrics, entrypoint="REST"),
            manager,
            inference=MonitoredInference(inference, metrics, entrypoint="REST"),
            timeout_ms=options.rest_api_timeout_in_ms,
            enable_cors=options.rest_api_enable_cors_support,
            prometheus=(metrics_path, metrics.render) if metrics_path is not None else None,
            limits=limits,
            on_limit=functools.partial(_count_limit, metrics, "REST"),
            codec_executor=json_pool if json_pool is not None else request_executor,
            tracing=tracing,
        )
        sock = bind(options.rest_api_host, options.rest_api_port)
        unix_sock = bind_unix(options.rest_api_socket_path) if options.rest_api_socket_path else None
        front_ends.append(
            RestServer(
                app,
                sock,
                limits,
                functools.partial(_count_limit, metrics, "REST"),
                json_processes=json_pool,
                unix_sock=unix_sock,
            )
        )
    if options.port or options.grpc_socket_path:
        prediction_service = PredictionService(
            MonitoredPredictor(predictor, metrics, entrypoint="GRPC"),
            MonitoredInference(inference, metrics, entrypoint="GRPC"),
            manager,
            response_tensor_content=options.grpc_response_tensor_content,
            limits=limits,
        )

        async def reload_config(new_config: ModelServerConfig) -> None:
            await load_executor.run(manager.reload_config, new_config)  # blocking: off the loop

        model_service = ModelService(manager, reload_config)
        front_ends.append(
            GrpcServer(
                options,
                prediction_service,
                model_service,
                on_limit=functools.partial(_count_limit, metrics, "GRPC"),
                tracing=tracing,
            )
        )
    if metrics_path is not None and not options.rest_api_port:
        _log.warning("--monitoring_config_file: metrics are served on the REST port, which is off")
    if not front_ends:
        _log.warning("No front end enabled (--rest_api_port=0 and --port=0); only loading")
    return ModelServer(manager, front_ends, load_executor, config_poller, executors, tracing)


def load_tracing() -> ServingTracing | None:
    """The server's tracing when the ``OTEL_*`` variables turn it on (``otel_tracing``), else None
    (OpenTelemetry not imported).

    Raises :class:`~serving.util.errors.ServingError` ``INVALID_ARGUMENT`` for an exporter or OTLP
    protocol that cannot be served, or when the ``serving-tracing`` extra is not installed.
    """
    if not tracing_enabled():
        return None
    try:
        check_config()
        from serving.util.tracing import ServingTracing

        return ServingTracing()
    except (ValueError, ImportError) as exc:
        raise ServingError(Code.INVALID_ARGUMENT, f"Tracing (OTEL_* variables): {exc}") from None


def _loader(options: ServerOptions, metrics: ServingMetrics) -> Callable[[str], Any]:
    """``path -> servable``: the SavedModel loader with its metrics and (by default) warmup.

    Logs the Session thread pools it sizes and the flags accepted but not implemented yet.
    """
    intra_op, inter_op = flags.session_threads(options)
    _log.info(
        "TensorFlow Session thread pools: intra_op_parallelism_threads=%d "
        "inter_op_parallelism_threads=%d (schedulable CPUs under the container's quota: %d)",
        intra_op,
        inter_op,
        flags.schedulable_cpus(),
    )
    for name in flags.unimplemented_flags(options):
        _log.warning("--%s is accepted but not implemented yet; it has no effect", name)
    loader: Callable[[str], Any] = functools.partial(
        Servable.load,
        tags=flags.saved_model_tags(options),
        intra_op_threads=intra_op,
        inter_op_threads=inter_op,
        method_name_check=options.enable_signature_method_name_check,
    )
    loader = instrument_loader(loader, metrics)
    if options.enable_model_warmup:
        loader = functools.partial(
            warmup.load_with_warmup,
            loader,
            options=warmup.ModelWarmupOptions.from_flags(
                options.num_request_iterations_for_warmup,
                options.rest_api_timeout_in_ms if options.rest_api_port else 0,
            ),
            method_name_check=options.enable_signature_method_name_check,
            metrics=metrics,
        )
    return loader


def _batching_session(
    batching: BatchingOptions, metrics: ServingMetrics, tracing: ServingTracing | None = None
) -> tuple[BatchingSession, BlockingExecutor]:
    """``--enable_batching``: the batching Session and its batch threads."""
    _log.info("Batching: %s", batching.describe())
    batch_executor = BlockingExecutor(batching.num_batch_threads, batching.thread_pool_name)
    return BatchingSession(batching, batch_executor, metrics, tracing), batch_executor


def _monitored_session(session: Session, metrics: ServingMetrics, api: str) -> Session:
    """``session`` recording what TF Serving records per Session run of core API ``api``."""
    return MonitoredSession(session, metrics, api=api)


def _count_limit(metrics: ServingMetrics, entrypoint: str, error: LimitExceeded) -> None:
    """A request refused for a limit: ``request_limit_exceeded_count{entrypoint, reason}``."""
    metrics.record_limit_exceeded(entrypoint, error.reason)


def _freeze_heap(loading: asyncio.Future[Any]) -> None:
    """``gc.freeze()`` once the first versions are loaded: TensorFlow and the models leave some
    400,000 long-lived objects, and every full collection scanned them all -- a 200-600 ms pause of
    every request, several times a minute under load (measured: REST p99 375 ms -> 33 ms). Frozen
    objects are never collected; later garbage is, as before."""
    gc.collect()
    gc.freeze()
    _log.info("Froze %d objects out of the garbage collector's scans", gc.get_freeze_count())


def _log_loaded(manager: ServableManager, loading: asyncio.Future[Any]) -> None:
    if loading.cancelled():
        return
    if loading.exception() is not None:
        _log.error("Loading servables failed: %r", loading.exception())
        return
    for name, versions in manager.available_versions().items():
        if versions:
            _log.info("Model %s: available versions %s", name, versions)
        else:
            _log.warning("Model %s: no version available", name)


class FrontEnd(Protocol):
    """A protocol front end (REST, gRPC) as the server drives it."""

    @property
    def task(self) -> asyncio.Future[Any] | None:
        """Done when the front end stopped (or crashed); ``None`` before :meth:`start`."""

    async def start(self) -> None:
        """Start serving on the already bound sockets."""

    async def stop(self) -> None:
        """Stop accepting, finish in-flight requests."""

    def force(self) -> None:
        """Drop in-flight requests now (a second signal)."""


@contextlib.contextmanager
def _signals_set(stop: asyncio.Event, front_ends: list[FrontEnd]) -> Iterator[None]:
    """SIGTERM/SIGINT: first one stops gracefully, a second one forces the front ends down."""
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        if stop.is_set():
            _log.warning("Signal %d again: forcing shutdown", signum)
            for front_end in front_ends:
                front_end.force()
        else:
            _log.info("Signal %d received", signum)
            stop.set()

    handled = (signal.SIGTERM, signal.SIGINT)
    for signum in handled:
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        yield
    finally:
        for signum in handled:
            loop.remove_signal_handler(signum)
