"""The client's tracing seam: where a tracer may open spans, without the client knowing OpenTelemetry.

The client is usable alone and tracing is optional, so it imports no tracing library: it calls a
`ClientTracer` it was given (`open_serving_client(..., tracer=...)`; None, the default, costs an
`is None` test per call). Two places open a span:

* `CoalescingClient`, once per coalesced call: `coalesced_call(callers, attributes)`, where
  `callers` are what `caller()` returned in each request that joined the batch (the API's
  tracer returns the request's current span). One call serves several requests, so the tracer
  makes one span for it, a child of one caller and linked to the others (see the API's
  `api.observability.tracing`).
* `ReplicatedClient`, once per attempt on a replica: `attempt(method, attributes)`, with the
  attempt's number and the replica among the attributes; the transport's metadata provider runs
  inside it, so it can send the attempt's trace context as REST headers or gRPC metadata.

Each returns a context manager that yields a function to add attributes learnt from the answer
(the version that ran); an exception leaving the block marks the span failed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from api.serving_client._types import PredictRequest

AttributeValue = str | int | float | bool
Attributes = Mapping[str, AttributeValue]
Annotate = Callable[[str, AttributeValue], None]

#: TF Serving's gRPC service of each client method (rpc.service in the spans' attributes).
SERVICES: Mapping[str, str] = {
    "Predict": "tensorflow.serving.PredictionService",
    "GetModelMetadata": "tensorflow.serving.PredictionService",
    "GetModelStatus": "tensorflow.serving.ModelService",
}


class ClientTracer(Protocol):
    """Opens the serving client's spans (see the module doc); implemented by the API's tracing."""

    def caller(self) -> object:
        """The current caller's trace position (opaque to the client), taken when it joins a batch."""
        ...

    def coalesced_call(self, callers: Sequence[object], attributes: Attributes) -> AbstractContextManager[Annotate]:
        """A span for one call serving every caller in `callers` (in arrival order)."""
        ...

    def attempt(self, method: str, attributes: Attributes) -> AbstractContextManager[Annotate]:
        """A span for one attempt of `method` ("Predict", "GetModelStatus", ...) on one replica."""
        ...


def request_attributes(request: PredictRequest) -> dict[str, AttributeValue]:
    """A Predict's model_spec and batch size (rows of its first input) as span attributes."""
    spec = request.model_spec
    attributes: dict[str, AttributeValue] = {
        "tfserving.model_spec.name": spec.name,
        "tfserving.model_spec.signature_name": spec.signature_name,
    }
    if spec.version is not None:
        attributes["tfserving.model_spec.version"] = spec.version
    elif spec.version_label is not None:
        attributes["tfserving.model_spec.version_label"] = spec.version_label
    first = next(iter(request.inputs.values()), None)
    if first is not None:
        attributes["tfserving.batch_size"] = first.batch_size
    return attributes
