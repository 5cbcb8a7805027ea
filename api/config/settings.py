"""API settings, read from the environment (pydantic-settings).

Every field can be set by an environment variable of the same name in upper case,
e.g. `SERVING_URL=http://serving:8501`. Settings are built once by the composition
root (`api.app.create_app`) and passed down explicitly.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    AnyHttpUrl,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from api.config.oip import OipSettings
from api.config.payload_capture_settings import PayloadCaptureSettings
from api.config.rollouts import Rollout, RolloutsSettings
from api.config.security import AuthSettings, RateLimitSettings
from api.serving_client import ClientConfig, CoalescingConfig


def _upper(value: object) -> object:
    """Level names are accepted in any case (`LOG_LEVEL=debug`)."""
    return value.upper() if isinstance(value, str) else value


class ModelSettings(BaseModel):
    """One model route's settings in this deployment (`MODELS__<ROUTE>__<SETTING>`).

    The common ones are below; any other key is one of the route's own options (its
    `ModelRoute.options` model validates them, `api.config.enabled_routes`).
    """

    model_config = ConfigDict(extra="allow", protected_namespaces=())

    model_name: str | None = Field(default=None, description="Servable name; default: the route's.")
    signature_name: str | None = Field(default=None, description="SignatureDef; default: the route's.")
    max_body_bytes: int | None = Field(
        default=None,
        ge=1,
        description="Largest request body of the route (of the file, for an upload route), bytes; "
        "default: the route's, else MAX_BODY_BYTES.",
    )
    rollout: Rollout | None = Field(
        default=None,
        description="The route's rollout: stable, canary and shadow targets, weights, pinning "
        "(MODELS__<ROUTE>__ROLLOUT__STABLE=1, ...__CANARY=2, ...__CANARY_WEIGHT=10; api.config.rollouts); "
        "default: the route's model, latest version; the rollout file overrides it.",
    )
    capture_sample_rate: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="Fraction of the route's answered requests captured (PAYLOAD_CAPTURE__URL); default: the route's.",
    )


class Settings(BaseSettings):
    """Configuration of one API process."""

    # env_nested_delimiter: MODELS__FRAUD__THRESHOLD sets models["fraud"].threshold.
    model_config = SettingsConfigDict(
        env_prefix="", case_sensitive=False, extra="ignore", env_nested_delimiter="__"
    )

    serving_url: AnyHttpUrl = Field(
        default=AnyHttpUrl("http://127.0.0.1:8501"),
        description="Base URL of the serving tier's REST API (TF Serving's port 8501).",
    )
    # Model routes (api.config.enabled_routes): which are served, and their per-model settings.
    model_routes: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Model routes this deployment serves, comma-separated, each the import path of a "
        "`ModelRoute`, `package.module:attribute` (e.g. examples.fraud.route:route); required unless the "
        "app is given its routes (`create_app(routes=...)`).",
    )
    serving_model_config_file: Path | None = Field(
        default=None,
        description="Serving's model config file (TF Serving's `--model_config_file`), when the API can "
        "read it: a route whose model serving lacks is refused at start-up with the models this file "
        "names. run-server.sh sets it; unset, the message names only the missing model.",
    )
    models: dict[str, ModelSettings] = Field(
        default_factory=dict,
        description="Per-model settings by route name, from `MODELS__<ROUTE>__<SETTING>` "
        "(e.g. MODELS__FRAUD__SIGNATURE_NAME, MODELS__FRAUD__THRESHOLD).",
    )
    rollouts: RolloutsSettings = Field(
        default_factory=RolloutsSettings,
        description="The rollout file and the shadow traffic's bounds (ROLLOUTS__FILE, ...; api.config.rollouts).",
    )
    # The Open Inference Protocol front (api.oip): OIP__MODELS, OIP__GRPC_PORT, ...
    oip: OipSettings = Field(
        default_factory=OipSettings,
        description="The Open Inference Protocol (KServe v2) front, `OIP__<SETTING>` (api.config.oip).",
    )
    # The serving path (api.serving_client, api.request.admission.rules).
    serving_protocol: Literal["rest", "grpc"] = Field(
        default="rest", description="How the API calls serving: TF Serving's REST or gRPC API."
    )
    serving_urls: Annotated[list[AnyHttpUrl], NoDecode] = Field(
        default_factory=list,
        description="REST replicas, comma-separated base URLs (round-robin); empty means "
        "[SERVING_URL].",
    )
    serving_socket_path: str | None = Field(
        default=None,
        description="Serving's REST API on a Unix-domain socket of this host (run-server.sh sets "
        "it in the one-container mode): REST calls go there instead of to SERVING_URL(S).",
    )
    serving_grpc_targets: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["127.0.0.1:8500"],
        min_length=1,
        description="gRPC replicas, comma-separated host:port (round-robin; TF Serving's "
        "port 8500), used when SERVING_PROTOCOL=grpc.",
    )
    request_timeout_s: float = Field(
        default=2.0,
        gt=0.0,
        description="Time budget of one API request from arrival to answer, seconds; a caller "
        "may lower it with X-Request-Timeout-Ms. Past it the answer is 504.",
    )
    serving_timeout_s: float = Field(
        default=2.0,
        gt=0.0,
        description="Upper bound of one call to one serving replica, seconds (the request's "
        "remaining budget usually ends it sooner).",
    )
    serving_connect_timeout_s: float = Field(
        default=0.5, gt=0.0, description="TCP connect timeout to serving, seconds."
    )
    serving_max_connections: int | None = Field(
        default=None,
        ge=1,
        description="REST connection pool towards serving, per API process; default "
        "2 x MAX_IN_FLIGHT_REQUESTS (one connection per request a worker may hold in flight).",
    )
    serving_keepalive_expiry_s: float = Field(
        default=4.0,
        gt=0.0,
        description="Idle REST connections to serving are closed after this, seconds; keep it "
        "below serving's idle timeout (uvicorn's default: 5 s).",
    )
    serving_max_attempts: int = Field(
        default=3,
        ge=1,
        description="Attempts per call to serving across replicas; UNAVAILABLE (refused or "
        "dropped connection, 503) and an attempt past SERVING_ATTEMPT_TIMEOUT_S are retried on "
        "another replica within the deadline.",
    )
    serving_attempt_timeout_s: float = Field(
        default=0.5,
        gt=0.0,
        description="Longest one attempt takes when another replica could still be tried, "
        "seconds; then the call moves on (a hung replica costs this, not the request's whole "
        "budget). The last attempt gets what is left of the budget.",
    )
    serving_eject_s: float = Field(
        default=1.0,
        ge=0.0,
        description="A replica that refused a connection or ran past its attempt timeout is "
        "skipped this long, seconds.",
    )
    serving_resolve_interval_s: float = Field(
        default=2.0,
        ge=0.0,
        description="Serving's host names (SERVING_URL, SERVING_URLS, SERVING_GRPC_TARGETS) are "
        "resolved again this often, seconds, so replicas added or removed (docker compose "
        "--scale, a Kubernetes headless Service) are followed; 0 resolves once at start.",
    )
    serving_max_response_bytes: int = Field(
        default=4 * 1024 * 1024,
        ge=1024,
        description="Largest Predict answer taken from serving, bytes (REST body, gRPC message); "
        "lowered to what the enabled routes' declared outputs can take for a full coalesced batch "
        "(api.inference.response_bound). Over it: 502 serving_bad_response at once, the connection "
        "dropped, so a faulty replica cannot make a worker hold a huge body.",
    )
    deadline_shedding: bool = Field(
        default=True,
        description="Refuse at once (504 deadline_exceeded, serving not called) a request whose "
        "remaining budget is below the model's median latency over its recent calls in this "
        "worker: it would most likely time out while serving still does its work.",
    )
    max_in_flight_requests: int = Field(
        default=64,
        ge=1,
        description="Requests one worker handles at once; more are answered 503 with "
        "Retry-After at once, never queued.",
    )
    max_body_bytes: int = Field(
        default=64 * 1024,
        ge=1,
        description="Largest request body accepted, bytes; larger is answered 413 before it "
        "is buffered. Routes that take uploads (digits) get their own limit (api.app).",
    )
    # Coalescing is the product's one batching layer (api.serving_client._coalescing says
    # why it batches here and not in serving, and why the window is only a bound).
    coalescing_enabled: bool = Field(
        default=True,
        description="Merge concurrent predicts for the same model into one call to serving: a "
        "batch leaves at once while serving has room for it, else when a batch in flight comes "
        "back, so a request waits for nothing at low load.",
    )
    coalescing_window_ms: float = Field(
        default=20.0,
        ge=0.0,
        le=1000.0,
        description="The longest a batch waits for the batches in flight before it (a bound for "
        "when they do not come back, e.g. a hung replica), milliseconds.",
    )
    coalescing_max_batch_rows: int = Field(
        default=64, ge=1, description="Rows at which a batch is sent at once."
    )
    coalescing_eager_batches: int = Field(
        default=1,
        ge=0,
        le=64,
        description="A batch is sent without waiting while fewer than this many batches of the "
        "same model per serving replica are in flight (0: every batch waits its window).",
    )

    @field_validator("serving_urls", "serving_grpc_targets", "model_routes", mode="before")
    @classmethod
    def _split_commas(cls, value: object) -> object:
        """Lists come from the environment as comma-separated text."""
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @staticmethod
    def model_setting_variable(route: str, key: str) -> str:
        """The environment variable of a route's setting, for messages (`MODELS__FRAUD__THRESHOLD`)."""
        return f"MODELS__{route.upper()}__{key.upper()}"

    def model_setting_variables(self, route: str) -> list[str]:
        """Every variable that set one of `route`'s settings (`model_setting_variable`), sorted."""
        entry = self.models.get(route)
        if entry is None:
            return []
        keys = entry.model_fields_set | set(entry.model_extra or {})
        return sorted(self.model_setting_variable(route, key) for key in keys)

    @property
    def serving_rest_targets(self) -> list[str]:
        """REST base URLs of the serving replicas, without trailing slashes."""
        urls = self.serving_urls or [self.serving_url]
        return [str(url).rstrip("/") for url in urls]

    @property
    def serving_pool_size(self) -> int:
        """REST connections per API process: SERVING_MAX_CONNECTIONS, or the most requests one
        worker may hold in flight (twice its share, `api.request.admission.in_flight`)."""
        return self.serving_max_connections or 2 * self.max_in_flight_requests

    def serving_client_config(
        self, probe_model_names: Sequence[str] = (), max_response_bytes: int | None = None
    ) -> ClientConfig:
        """The serving client's configuration (`api.serving_client.open_serving_client`).

        Args:
            probe_model_names: the models a newly discovered replica must have AVAILABLE
                before it gets calls: the enabled routes' (`api.app` passes them).
            max_response_bytes: the Predict answer's bound the routes' outputs allow
                (`api.inference.response_bound`), capped by SERVING_MAX_RESPONSE_BYTES;
                None: that setting.
        """
        coalescing = (
            CoalescingConfig(
                window_s=self.coalescing_window_ms / 1000.0,
                max_batch_rows=self.coalescing_max_batch_rows,
                eager_batches=self.coalescing_eager_batches,
            )
            if self.coalescing_enabled
            else None
        )
        return ClientConfig(
            protocol=self.serving_protocol,
            rest_targets=tuple(self.serving_rest_targets),
            grpc_targets=tuple(self.serving_grpc_targets),
            call_timeout_s=self.serving_timeout_s,
            connect_timeout_s=self.serving_connect_timeout_s,
            max_connections=self.serving_pool_size,
            keepalive_expiry_s=self.serving_keepalive_expiry_s,
            max_attempts=self.serving_max_attempts,
            eject_s=self.serving_eject_s,
            attempt_timeout_s=self.serving_attempt_timeout_s,
            resolve_interval_s=self.serving_resolve_interval_s,
            probe_model_names=tuple(probe_model_names),
            versions_interval_s=self.model_version_ttl_s,
            coalescing=coalescing,
            rest_socket_path=self.serving_socket_path or None,
            max_response_bytes=min(max_response_bytes or self.serving_max_response_bytes,
                                   self.serving_max_response_bytes),  # fmt: skip
        )

    model_version_ttl_s: float = Field(
        default=5.0,
        ge=0.0,
        description="How long each serving replica's AVAILABLE versions and labels, read from its "
        "model status, are trusted before they are read again, seconds (at least 0.25); calls go only "
        "to replicas that have the version they ask for.",
    )

    # The operational port (api.operational; gunicorn.conf.py starts it).
    api_ops_bind: str = Field(
        default="",
        description="host:port of the operational port, which serves /metrics, /docs and /openapi.json "
        "in a process of its own (gunicorn.conf.py sets 0.0.0.0:9000 by default); while it is set the "
        "public port does not serve them. Empty (one uvicorn process): the app serves them itself.",
    )

    # Observability (api.request.middleware; api.observability: loop_monitor, logging_config).
    log_level: Annotated[
        Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], BeforeValidator(_upper)
    ] = Field(default="INFO", description="Level of the API's JSON logs (`api.*`).")
    access_log: bool = Field(
        default=True, description="Write one JSON access-log line per request (`api.access`)."
    )
    loop_monitor_interval_s: float = Field(
        default=0.05, gt=0.0, description="Period of the event-loop lag probe, seconds."
    )
    loop_block_threshold_s: float = Field(
        default=0.1,
        gt=0.0,
        description="A callback holding the event loop longer than this is logged and "
        "counted as a block, seconds.",
    )
    # Score events (api.observability.events).
    events_jsonl_path: Path = Field(
        default=Path(tempfile.gettempdir()) / "api-score-events.jsonl",
        description="JSON Lines file score events are appended to (when EVENTS_HTTP_URL "
        "is not set).",
    )
    events_http_url: AnyHttpUrl | None = Field(
        default=None, description="POST score events here (JSON Lines) instead of to the file."
    )
    events_http_timeout_s: float = Field(
        default=2.0, gt=0.0, description="Timeout of one POST of a batch of events, seconds."
    )
    events_max_queue: int = Field(
        default=10_000, ge=1, description="Score events held in memory at most; more are dropped."
    )
    events_batch_size: int = Field(
        default=256, ge=1, description="Score events written to the sink per batch at most."
    )
    events_linger_s: float = Field(
        default=0.05, ge=0.0, description="How long a batch waits for more events, seconds."
    )
    # Payload capture (api.observability.payload_capture): PAYLOAD_CAPTURE__URL, ...
    payload_capture: PayloadCaptureSettings = Field(
        default_factory=PayloadCaptureSettings,
        description="Where sampled requests and responses go (PAYLOAD_CAPTURE__<SETTING>).",
    )
    # The front door (api.config.security, api.security): authentication and per-client rate limits.
    auth: AuthSettings = Field(
        default_factory=AuthSettings, description="Authentication, off by default (AUTH__ENABLED, AUTH__...)."
    )
    rate_limits: RateLimitSettings = Field(
        default_factory=RateLimitSettings, description="Per-client rate limits, off until a rule is set "
        "(RATE_LIMITS__ROUTES)."
    )
