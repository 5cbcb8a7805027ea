"""``tensorflow.serving.PredictionService`` on ``grpc.aio``: TF Serving's ``prediction_service_impl.cc``.

Predict (:class:`~serving.servables.tensorflow.predict_impl.Predictor`), Classify, Regress,
MultiInference (:class:`~serving.servables.tensorflow.inference_runner.InferenceRunner`) and
GetModelMetadata (:mod:`serving.servables.tensorflow.get_model_metadata_impl`). Like the REST
handler, the servicer only decodes (:mod:`serving.util.proto_codec`), calls the core and encodes;
errors become statuses in one place (:mod:`serving.model_servers.grpc_status_util`), the server is
built in :mod:`serving.model_servers.grpc_server`.

The call's deadline bounds the ``Session`` run (``enforce_session_run_timeout``, TF Serving's
default; ``DeadlineToTimeoutMillis`` of ``prediction_service_util.cc``): the remaining time,
rounded up to a power of two milliseconds so that the cached Session callables (one per distinct
timeout) stay few; gRPC itself still ends the call with ``DEADLINE_EXCEEDED`` at the exact deadline.

Predict answers with the typed ``*_val`` fields (TF Serving's default ``kAsProtoField``: clients
reading ``outputs["y"].float_val`` work); ``--grpc_response_tensor_content`` switches to
``tensor_content``.
"""

from __future__ import annotations

import math
from typing import Any

import grpc
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    inference_pb2,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

from serving.core.manager import ServableManager
from serving.servables.tensorflow import get_model_metadata_impl as metadata
from serving.servables.tensorflow.inference_runner import InferenceService
from serving.servables.tensorflow.predict_impl import PredictService
from serving.util import proto_codec
from serving.util.request_limits import RequestLimits

__all__ = ["PredictionService", "session_timeout_ms"]


def session_timeout_ms(context: grpc.aio.ServicerContext[Any, Any]) -> int | None:
    """The ``Session`` run timeout for a call: its remaining deadline in ms, rounded up to a
    power of two (see module doc); ``None`` without a deadline or once it has passed (gRPC
    ends the call then; TF Serving likewise treats a timeout <= 0 as none)."""
    remaining = context.time_remaining()
    if remaining is None or remaining <= 0:
        return None
    millis = max(1, math.ceil(remaining * 1000))
    return 1 << (millis - 1).bit_length()


class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):  # type: ignore[misc]  # the wheel has no types
    """``tensorflow.serving.PredictionService``."""

    def __init__(
        self,
        predictor: PredictService,
        inference: InferenceService,
        manager: ServableManager,
        *,
        response_tensor_content: bool = False,
        limits: RequestLimits | None = None,
    ) -> None:
        """``limits`` bound each request's elements (``--max_request_elements``)."""
        self._limits = limits
        self._predictor = predictor
        self._inference = inference
        self._manager = manager
        self._tensor_content = response_tensor_content

    async def Predict(  # noqa: N802 - the generated servicer's method names
        self, request: predict_pb2.PredictRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> predict_pb2.PredictResponse:
        """``Predict``: tensors in, tensors out (see :meth:`Predictor.predict
        <serving.servables.tensorflow.predict_impl.Predictor.predict>`)."""
        core_request = proto_codec.predict_request_from_proto(request, self._limits)
        response = await self._predictor.predict(
            core_request, timeout_ms=session_timeout_ms(context)
        )
        return proto_codec.predict_response_to_proto(response, as_content=self._tensor_content)

    async def Classify(  # noqa: N802
        self, request: classification_pb2.ClassificationRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> classification_pb2.ClassificationResponse:
        """``Classify``: tf.Examples in, (label, score) lists out."""
        core_request = proto_codec.example_request_from_proto(request, self._limits)
        response = await self._inference.classify(
            core_request, timeout_ms=session_timeout_ms(context)
        )
        return proto_codec.classification_response_to_proto(response)

    async def Regress(  # noqa: N802
        self, request: regression_pb2.RegressionRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> regression_pb2.RegressionResponse:
        """``Regress``: tf.Examples in, one value each out."""
        core_request = proto_codec.example_request_from_proto(request, self._limits)
        response = await self._inference.regress(
            core_request, timeout_ms=session_timeout_ms(context)
        )
        return proto_codec.regression_response_to_proto(response)

    async def MultiInference(  # noqa: N802
        self, request: inference_pb2.MultiInferenceRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> inference_pb2.MultiInferenceResponse:
        """``MultiInference``: several classify/regress signatures, one Session run."""
        core_request = proto_codec.multi_inference_request_from_proto(request, self._limits)
        response = await self._inference.multi_inference(
            core_request, timeout_ms=session_timeout_ms(context)
        )
        return proto_codec.multi_inference_response_to_proto(response)

    async def GetModelMetadata(  # noqa: N802
        self,
        request: get_model_metadata_pb2.GetModelMetadataRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> get_model_metadata_pb2.GetModelMetadataResponse:
        """``GetModelMetadata``: the servable's SignatureDefs, ``Any``-packed
        ``SignatureDefMap`` under ``metadata["signature_def"]`` (the only field there is)."""
        proto_codec.require_model_spec(request)
        spec = proto_codec.model_spec_from_proto(request.model_spec)
        return metadata.get_model_metadata(self._manager, spec, request.metadata_field)
