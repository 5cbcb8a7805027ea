"""``tensorflow_serving.apis`` protos <-> the server's internal request and response types.

The gRPC front end's codec (the REST one is :mod:`serving.util.json_tensor` /
:mod:`serving.util.json_example`): it turns the official messages (``predict.proto``,
``classification.proto``, ``regression.proto``, ``inference.proto``, ``input.proto``,
``model.proto``) into :mod:`serving.apis` / :mod:`serving.servables.tensorflow.classifier` types and back, with
TF Serving's request checks that happen before any servable is looked up:

* a request without ``model_spec`` -> ``INVALID_ARGUMENT Missing ModelSpec`` (predict_impl.cc,
  classification_service.cc, regression_service.cc);
* an input tensor TensorFlow cannot parse -> ``INVALID_ARGUMENT tensor parsing error: <alias>``
  (predict_util.cc). Inputs are decoded when the servable reads them, after it has checked the
  signature and the request's aliases, in TF Serving's order.

Tensors go through :mod:`serving.util.tensor_proto`. Examples (``Input``) become the serialized
``tf.Example`` bytes TF Serving feeds (``InputToSerializedExampleTensor``): with
``example_list_with_context`` each is the serialized context followed by the serialized example.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping

import numpy as np
from google.protobuf.message import Message
from tensorflow.core.framework.tensor_pb2 import TensorProto
from tensorflow_serving.apis import (
    classification_pb2,
    inference_pb2,
    input_pb2,
    model_pb2,
    predict_pb2,
    regression_pb2,
)

from serving.apis import (
    ClassificationResponse,
    ClassificationResult,
    ExampleRequest,
    InferenceTask,
    ModelSpec,
    MultiInferenceRequest,
    MultiInferenceResponse,
    PredictRequest,
    PredictResponse,
    RegressionResponse,
)
from serving.util import tensor_proto
from serving.util.errors import Code, ServingError
from serving.util.request_limits import RequestLimits

__all__ = [
    "classification_response_to_proto",
    "example_request_from_proto",
    "examples_from_input",
    "inputs_from_proto",
    "model_spec_from_proto",
    "model_spec_to_proto",
    "multi_inference_request_from_proto",
    "multi_inference_response_to_proto",
    "predict_request_from_proto",
    "predict_response_to_proto",
    "regression_response_to_proto",
    "require_model_spec",
]


def require_model_spec(request: Message) -> None:
    """Raise ``INVALID_ARGUMENT Missing ModelSpec`` when ``request.model_spec`` is unset."""
    if not request.HasField("model_spec"):
        raise ServingError(Code.INVALID_ARGUMENT, "Missing ModelSpec")


def model_spec_from_proto(proto: model_pb2.ModelSpec) -> ModelSpec:
    """``ModelSpec``: name, ``version`` or ``version_label`` (the ``version_choice`` oneof)."""
    choice = proto.WhichOneof("version_choice")
    return ModelSpec(
        name=proto.name,
        version=proto.version.value if choice == "version" else None,
        version_label=proto.version_label if choice == "version_label" else None,
        signature_name=proto.signature_name,
    )


def model_spec_to_proto(spec: ModelSpec, proto: model_pb2.ModelSpec) -> None:
    """``MakeModelSpec``: name, version and (when set) the signature name used."""
    proto.name = spec.name
    if spec.version is not None:
        proto.version.value = spec.version
    if spec.signature_name:
        proto.signature_name = spec.signature_name


def inputs_from_proto(
    inputs: Mapping[str, TensorProto], limits: RequestLimits | None = None
) -> Mapping[str, np.ndarray]:
    """A ``PredictRequest``'s ``inputs`` map as numpy arrays, ``{alias: array}``, each decoded when
    it is first read (see :class:`_ProtoInputs`)."""
    return _ProtoInputs(inputs, limits)


class _ProtoInputs(Mapping[str, np.ndarray]):
    """``inputs`` decoded on demand, as TF Serving reads them: the servable first compares the
    request's aliases with its signature's (``VerifyRequestInputsSize``), then decodes only the
    signature's (``GetInputValues``). So a request with 200,000 aliases is refused after a count,
    not after decoding every tensor (which kept the event loop, and so the REST port, ~2 s).

    The first tensor read checks the elements the shapes of all inputs declare against
    ``limits`` (:func:`~serving.util.request_limits.too_many_elements`) -- before anything is
    allocated, since a typed field's last value fills any shape (``float_val: 1`` with a shape of
    ``[2**31]`` would take 8 GiB). A tensor TensorFlow cannot parse raises ``INVALID_ARGUMENT``
    ``tensor parsing error: <alias>`` (predict_util.cc, ``PreProcessPrediction``).
    """

    def __init__(self, tensors: Mapping[str, TensorProto], limits: RequestLimits | None) -> None:
        self._tensors = tensors
        self._limits = limits
        self._arrays: dict[str, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self._tensors)

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __contains__(self, alias: object) -> bool:
        return alias in self._tensors

    def __getitem__(self, alias: str) -> np.ndarray:
        array = self._arrays.get(alias)
        if array is not None:
            return array
        tensor = self._tensors[alias]  # KeyError, as a Mapping's
        if not self._arrays and self._limits is not None:
            self._limits.check_elements(sum(_declared_elements(t) for t in self._tensors.values()))
        try:
            array = tensor_proto.to_ndarray(tensor)
        except tensor_proto.TensorProtoError:
            raise ServingError(Code.INVALID_ARGUMENT, f"tensor parsing error: {alias}") from None
        self._arrays[alias] = array
        return array


def _declared_elements(tensor: TensorProto) -> int:
    """The elements a tensor's shape declares (negative sizes count as 0: refused later)."""
    return math.prod(max(dim.size, 0) for dim in tensor.tensor_shape.dim)


def predict_request_from_proto(
    proto: predict_pb2.PredictRequest, limits: RequestLimits | None = None
) -> PredictRequest:
    """``PredictRequest`` -> :class:`~serving.apis.PredictRequest` (numpy inputs), within
    ``limits`` (see :func:`inputs_from_proto`)."""
    require_model_spec(proto)
    return PredictRequest(
        model_spec=model_spec_from_proto(proto.model_spec),
        inputs=inputs_from_proto(proto.inputs, limits),
        output_filter=tuple(proto.output_filter),
    )


def predict_response_to_proto(
    response: PredictResponse, *, as_content: bool = False
) -> predict_pb2.PredictResponse:
    """:class:`~serving.apis.PredictResponse` -> ``PredictResponse``.

    ``as_content`` writes numeric outputs to ``tensor_content`` instead of the typed fields (see
    :func:`serving.util.tensor_proto.from_ndarray`).
    """
    proto = predict_pb2.PredictResponse()
    model_spec_to_proto(response.model_spec, proto.model_spec)
    for alias, array in response.outputs.items():
        try:
            tensor_proto.from_ndarray(array, proto.outputs[alias], as_content=as_content)
        except tensor_proto.TensorProtoError as exc:
            raise ServingError(Code.INTERNAL, f"output {alias}: {exc}") from None
    return proto


def examples_from_input(proto: input_pb2.Input, limits: RequestLimits | None = None) -> np.ndarray:
    """``InputToSerializedExampleTensor``: a 1-D ``object`` array of serialized Examples.

    Raises :func:`~serving.util.request_limits.too_many_elements` for more Examples than
    ``limits`` allow.
    """
    kind = proto.WhichOneof("kind")
    if limits is not None and kind is not None:
        limits.check_elements(len(getattr(proto, kind).examples), "tf.Examples")
    if kind == "example_list":
        serialized = [example.SerializeToString() for example in proto.example_list.examples]
    elif kind == "example_list_with_context":
        with_context = proto.example_list_with_context
        context = with_context.context.SerializeToString()
        serialized = [context + example.SerializeToString() for example in with_context.examples]
    else:
        serialized = []
    examples = np.empty(len(serialized), dtype=object)
    examples[:] = serialized
    return examples


def example_request_from_proto(
    proto: classification_pb2.ClassificationRequest | regression_pb2.RegressionRequest,
    limits: RequestLimits | None = None,
) -> ExampleRequest:
    """``ClassificationRequest`` / ``RegressionRequest`` -> :class:`ExampleRequest`."""
    require_model_spec(proto)
    return ExampleRequest(
        model_spec_from_proto(proto.model_spec), examples_from_input(proto.input, limits)
    )


def _fill_classification_result(
    result: ClassificationResult, proto: classification_pb2.ClassificationResult
) -> None:
    labels = result.label_texts() if result.labels is not None else None
    scores = result.scores.tolist() if result.scores is not None else None
    for row in range(result.num_examples):
        classes = proto.classifications.add().classes
        for column in range(result.num_classes):
            entry = classes.add()
            if labels is not None:
                entry.label = labels[row][column]
            if scores is not None:
                entry.score = scores[row][column]


def classification_response_to_proto(
    response: ClassificationResponse,
) -> classification_pb2.ClassificationResponse:
    """:class:`ClassificationResponse` -> ``ClassificationResponse``."""
    proto = classification_pb2.ClassificationResponse()
    model_spec_to_proto(response.model_spec, proto.model_spec)
    _fill_classification_result(response.result, proto.result)
    return proto


def regression_response_to_proto(
    response: RegressionResponse,
) -> regression_pb2.RegressionResponse:
    """:class:`RegressionResponse` -> ``RegressionResponse``."""
    proto = regression_pb2.RegressionResponse()
    model_spec_to_proto(response.model_spec, proto.model_spec)
    for value in response.values.tolist():
        proto.result.regressions.add().value = value
    return proto


def multi_inference_request_from_proto(
    proto: inference_pb2.MultiInferenceRequest, limits: RequestLimits | None = None
) -> MultiInferenceRequest:
    """``MultiInferenceRequest`` -> :class:`MultiInferenceRequest`."""
    tasks = tuple(
        InferenceTask(model_spec_from_proto(task.model_spec), task.method_name)
        for task in proto.tasks
    )
    return MultiInferenceRequest(tasks, examples_from_input(proto.input, limits))


def multi_inference_response_to_proto(
    response: MultiInferenceResponse,
) -> inference_pb2.MultiInferenceResponse:
    """:class:`MultiInferenceResponse` -> ``MultiInferenceResponse`` (results in task order)."""
    proto = inference_pb2.MultiInferenceResponse()
    for result in response.results:
        entry = proto.results.add()
        model_spec_to_proto(result.model_spec, entry.model_spec)
        if isinstance(result, ClassificationResponse):
            _fill_classification_result(result.result, entry.classification_result)
        else:
            for value in result.values.tolist():
                entry.regression_result.regressions.add().value = value
    return proto
