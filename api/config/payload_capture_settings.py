"""The payload capture's settings (`PAYLOAD_CAPTURE__<SETTING>`), a nested model of `Settings`.

Which requests of a route are captured is the route's (`ModelRoute.capture`,
`MODELS__<ROUTE>__CAPTURE_SAMPLE_RATE`); these say where the captured CloudEvents go and how
much may wait (`api.observability.payload_capture`).
"""

from __future__ import annotations

from pydantic import AnyHttpUrl, BaseModel, ConfigDict, Field


class PayloadCaptureSettings(BaseModel):
    """Where captured requests and responses go (`PAYLOAD_CAPTURE__URL=http://logger:8080`)."""

    model_config = ConfigDict(extra="forbid")

    url: AnyHttpUrl | None = Field(
        default=None,
        description="POST each captured request and response here as a CloudEvent (binary mode, KServe's "
        "inference logger format); unset: nothing is captured, whatever the routes' sample rates.",
    )
    max_queue: int = Field(
        default=1000, ge=1, description="Captured events held in memory at most; more are dropped and counted."
    )
    concurrency: int = Field(default=4, ge=1, le=64, description="POSTs to the sink in flight at once, per worker.")
    timeout_s: float = Field(default=2.0, gt=0.0, description="Timeout of one POST, seconds.")
    source: str = Field(
        default="",
        description="The events' `ce-source` prefix (e.g. http://fraud-api.prod/); the route's path is added. "
        "Empty: the route's path alone.",
    )
    namespace: str = Field(default="", description="The events' `ce-namespace` (KServe's namespace extension).")
    component: str = Field(
        default="transformer",
        description="The events' `ce-component`: KServe's name for the component that takes raw requests and "
        "pre- and post-processes them around the predictor, as a model route does.",
    )
