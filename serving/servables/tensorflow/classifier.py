"""Classify, Regress and MultiInference: inference on serialized ``tf.Example`` inputs.

The core both front ends call, as :class:`~serving.servables.tensorflow.predict_impl.Predictor` is
for Predict. Follows TF
Serving's ``servables/tensorflow/classifier.cc``, ``regressor.cc``, ``multi_inference.cc`` and
``util.cc`` (``InputToSerializedExampleTensor``, ``PerformOneShotTensorComputation``), with their
error codes and messages:

* the signature (``signature_name``, empty = ``serving_default``) must exist -- ``INVALID_ARGUMENT
  No signature was found with the name: <name>``;
* with ``--enable_signature_method_name_check`` its ``method_name`` must be
  ``tensorflow/serving/classify`` (``/regress``) -- ``Expected classification signature
  method_name to be ...``. Without it (TF Serving's default) any signature of the right shape
  works: one input ``inputs`` (a string tensor fed with the serialized Examples) and the outputs
  ``classes`` (DT_STRING ``[batch, k]``) and/or ``scores`` (DT_FLOAT ``[batch, k]``) for classify,
  ``outputs`` (DT_FLOAT ``[batch]`` or ``[batch, 1]``) for regress;
* the request holds at least one Example -- ``INVALID_ARGUMENT Input is empty.``;
* one ``Session`` run feeds the Examples (with ``ExampleListWithContext`` each one is the
  serialized context followed by the serialized example: a protobuf merge in which the example's
  features win) and fetches the output tensors; their shapes and dtypes are then checked
  (``Expected Tensor shape: [batch_size num_classes] but got [3]``, ...).

MultiInference runs several classify/regress signatures of one model that share the same input
tensor in a single ``Session`` run (``Input tensor must be the same for all Signatures.``).

Requests and results here are numpy-based; the REST codec (:mod:`serving.util.json_example`) and the
gRPC codec (:mod:`serving.util.proto_codec`) translate. Each API is split like TF Serving's
``RunClassify`` / ``RunRegress`` / ``RunMultiInference``: :func:`prepare_classify` (and
``prepare_regress``, ``prepare_multi_inference``) does the checks and names the tensors (an
:class:`InferenceCall`), a ``Session`` run computes them, and
:meth:`InferenceCall.finish` post-processes. :class:`InferenceRunner` does this for requests
(checks on the event loop -- they are cheap -- and the run through the same
:class:`~serving.servables.tensorflow.serving_session.Session` as Predict);
:mod:`serving.servables.tensorflow.saved_model_warmup` does it for the warmup
records of a version being loaded, on its servable directly.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
from google.protobuf import text_format
from tensorflow.core.protobuf.meta_graph_pb2 import SignatureDef

from serving.apis import DEFAULT_SIGNATURE, ModelSpec
from serving.core.manager import ServableHandle, ServableManager
from serving.servables.tensorflow.serving_session import DirectSession, Session
from serving.util.errors import Code, ServingError
from serving.util.executor import BlockingExecutor
from serving.util.tensor_proto import data_type_name

__all__ = [
    "CLASSIFY_API",
    "CLASSIFY_METHOD_NAME",
    "INFERENCE_APIS",
    "MULTI_INFERENCE_API",
    "REGRESS_API",
    "REGRESS_METHOD_NAME",
    "ClassificationResponse",
    "ClassificationResult",
    "ExampleRequest",
    "InferenceCall",
    "InferenceRunner",
    "InferenceService",
    "InferenceTask",
    "MethodName",
    "MultiInferenceRequest",
    "MultiInferenceResponse",
    "RegressionResponse",
    "classification_signature",
    "postprocess_classification",
    "postprocess_regression",
    "prepare_classify",
    "prepare_multi_inference",
    "prepare_regress",
    "preprocess_classification",
    "preprocess_regression",
    "regression_signature",
]

#: The core APIs' names (the gRPC methods; the ``API`` label of TF Serving's runtime metrics).
CLASSIFY_API = "Classify"
REGRESS_API = "Regress"
MULTI_INFERENCE_API = "MultiInference"
INFERENCE_APIS = (CLASSIFY_API, REGRESS_API, MULTI_INFERENCE_API)

_R = TypeVar("_R")

#: ``kClassifyMethodName`` / ``kRegressMethodName`` (``signature_constants.h``).
CLASSIFY_METHOD_NAME = "tensorflow/serving/classify"
REGRESS_METHOD_NAME = "tensorflow/serving/regress"

# SignatureDef keys (signature_constants.h): kClassifyInputs, kClassifyOutputClasses, ...
_CLASSIFY_INPUTS = "inputs"
_CLASSIFY_OUTPUT_CLASSES = "classes"
_CLASSIFY_OUTPUT_SCORES = "scores"
_REGRESS_INPUTS = "inputs"
_REGRESS_OUTPUTS = "outputs"


class MethodName(enum.Enum):
    """The two Example-based APIs (``InferenceTask.method_name``)."""

    CLASSIFY = CLASSIFY_METHOD_NAME
    REGRESS = REGRESS_METHOD_NAME


@dataclass(frozen=True)
class ExampleRequest:
    """``ClassificationRequest`` / ``RegressionRequest``: a model spec and its Examples.

    ``examples`` is a 1-D ``object`` array of ``bytes``, each a serialized ``tf.Example`` (with
    any context already prepended); it may be empty (the core answers ``Input is empty.`` after
    resolving the servable and signature, in TF Serving's order).
    """

    model_spec: ModelSpec
    examples: np.ndarray


@dataclass(frozen=True)
class ClassificationResult:
    """``ClassificationResult`` as arrays: ``labels`` (bytes, ``object``) and/or ``scores``
    (``float32``), each ``[num_examples, num_classes]``; ``None`` when the signature lacks that
    output (TF Serving then leaves ``label`` empty / ``score`` 0)."""

    num_examples: int
    num_classes: int
    labels: np.ndarray | None
    scores: np.ndarray | None

    def label_texts(self) -> list[list[str]]:
        """The labels as text, ``[num_examples][num_classes]`` (``""`` without a ``classes``
        output). ``Class.label`` is a proto ``string``: bytes that are not UTF-8 are replaced."""
        if self.labels is None:
            return [[""] * self.num_classes for _ in range(self.num_examples)]
        texts: list[list[str]] = np.frompyfunc(_label_text, 1, 1)(self.labels).tolist()
        return texts


@dataclass(frozen=True)
class ClassificationResponse:
    """``ClassificationResponse``: the resolved spec (version, signature) and the result."""

    model_spec: ModelSpec
    result: ClassificationResult


@dataclass(frozen=True)
class RegressionResponse:
    """``RegressionResponse``: the resolved spec and one ``float32`` value per example."""

    model_spec: ModelSpec
    values: np.ndarray


@dataclass(frozen=True)
class InferenceTask:
    """``InferenceTask``: a model spec (name + signature) and the API to run it with."""

    model_spec: ModelSpec
    method_name: str


@dataclass(frozen=True)
class MultiInferenceRequest:
    """``MultiInferenceRequest``: tasks on one model sharing one set of Examples."""

    tasks: tuple[InferenceTask, ...]
    examples: np.ndarray


@dataclass(frozen=True)
class MultiInferenceResponse:
    """``MultiInferenceResponse``: one result per task, in task order."""

    results: tuple[ClassificationResponse | RegressionResponse, ...]


class InferenceService(Protocol):
    """What the front ends call for Classify, Regress and MultiInference: an
    :class:`InferenceRunner` or a wrapper with its interface
    (:class:`serving.util.metrics.MonitoredInference`)."""

    async def classify(
        self, request: ExampleRequest, *, timeout_ms: int | None = None
    ) -> ClassificationResponse:
        """See :meth:`InferenceRunner.classify`."""
        ...

    async def regress(
        self, request: ExampleRequest, *, timeout_ms: int | None = None
    ) -> RegressionResponse:
        """See :meth:`InferenceRunner.regress`."""
        ...

    async def multi_inference(
        self, request: MultiInferenceRequest, *, timeout_ms: int | None = None
    ) -> MultiInferenceResponse:
        """See :meth:`InferenceRunner.multi_inference`."""
        ...


@dataclass(frozen=True)
class InferenceCall(Generic[_R]):
    """One checked Classify, Regress or MultiInference call in ``Session`` terms.

    What :func:`prepare_classify`, :func:`prepare_regress` and :func:`prepare_multi_inference`
    return -- TF Serving's pre-processing, done -- and what both callers run: the request path
    (:class:`InferenceRunner`, through a
    :class:`~serving.servables.tensorflow.serving_session.Session`) and the warmup replay
    (:mod:`serving.servables.tensorflow.saved_model_warmup`, on the servable directly), so that the
    two cannot drift apart.

    ``feeds`` is ``{input tensor name: 1-D object array of serialized Examples}``, ``fetches``
    the output tensor names; :meth:`finish` turns the fetched values (in ``fetches`` order) into
    the response, with TF Serving's post-processing checks. ``api`` names the core API
    (``Classify``, ``Regress``, ``MultiInference``; the metrics' ``API`` label).
    """

    api: str
    feeds: Mapping[str, np.ndarray]
    fetches: tuple[str, ...]
    _finish: Callable[[Sequence[np.ndarray]], _R]

    def finish(self, outputs: Sequence[np.ndarray]) -> _R:
        """``PostProcess*Result``: the response from the fetched values. Raises
        ``INVALID_ARGUMENT`` (or ``FAILED_PRECONDITION``) for outputs of the wrong shape or
        dtype, with TF Serving's messages."""
        return self._finish(outputs)


def prepare_classify(
    signatures: Mapping[str, SignatureDef],
    request: ExampleRequest,
    version: int | None,
    method_name_check: bool,
) -> InferenceCall[ClassificationResponse]:
    """``RunClassify`` up to the Session run (classifier.cc): resolve and check the signature,
    then the Examples. ``version`` is the servable's, for the response (``None``: unknown, as in
    warmup). Raises ``INVALID_ARGUMENT`` ``No signature was found with the name: <name>``, the
    signature checks of :func:`preprocess_classification` and ``Input is empty.``."""
    spec = request.model_spec
    name, signature = classification_signature(signatures, spec.signature_name, method_name_check)
    input_name, output_names = preprocess_classification(signature, method_name_check)
    examples = _require_examples(request.examples)
    response_spec = _response_spec(spec.name, name, version)

    def finish(outputs: Sequence[np.ndarray]) -> ClassificationResponse:
        result = postprocess_classification(signature, len(examples), output_names, outputs)
        return ClassificationResponse(response_spec, result)

    return InferenceCall(CLASSIFY_API, {input_name: examples}, output_names, finish)


def prepare_regress(
    signatures: Mapping[str, SignatureDef],
    request: ExampleRequest,
    version: int | None,
    method_name_check: bool,
) -> InferenceCall[RegressionResponse]:
    """``RunRegress`` up to the Session run (regressor.cc); see :func:`prepare_classify`."""
    spec = request.model_spec
    name, signature = regression_signature(signatures, spec.signature_name, method_name_check)
    input_name, output_names = preprocess_regression(signature, method_name_check)
    examples = _require_examples(request.examples)
    response_spec = _response_spec(spec.name, name, version)

    def finish(outputs: Sequence[np.ndarray]) -> RegressionResponse:
        values = postprocess_regression(signature, len(examples), output_names, outputs)
        return RegressionResponse(response_spec, values)

    return InferenceCall(REGRESS_API, {input_name: examples}, output_names, finish)


def prepare_multi_inference(
    signatures: Mapping[str, SignatureDef],
    request: MultiInferenceRequest,
    version: int | None,
    method_name_check: bool,
) -> InferenceCall[MultiInferenceResponse]:
    """``TensorFlowMultiInferenceRunner::Infer`` up to the Session run (multi_inference.cc):
    every task is checked, and the union of their outputs is fetched in one run.

    Raises ``INVALID_ARGUMENT`` ``Found ModelSpec with an empty model name.``, ``All ModelSpecs in
    a MultiInferenceRequest must access the same model name.``, ``Duplicate evaluation of
    signature: <s>``, ``Requested signature not found in model graph: <s>``, ``Input tensor must
    be the same for all Signatures.``, ``Input is empty.``; ``UNIMPLEMENTED`` ``Unsupported
    signature method_name: <m>``; and the classify/regress signature checks.
    """
    model_name = ""
    input_name = ""
    seen: set[str] = set()
    resolved: list[tuple[str, SignatureDef]] = []
    output_set: set[str] = set()
    for task in request.tasks:
        if not task.model_spec.name:
            raise _invalid("Found ModelSpec with an empty model name.")
        if not model_name:
            model_name = task.model_spec.name
        elif model_name != task.model_spec.name:
            raise _invalid(
                "All ModelSpecs in a MultiInferenceRequest must access the same model name."
            )
        name = task.model_spec.signature_name or DEFAULT_SIGNATURE
        if name in seen:
            raise _invalid(f"Duplicate evaluation of signature: {name}")
        seen.add(name)
        signature = signatures.get(name)
        if signature is None:
            raise _invalid(f"Requested signature not found in model graph: {name}")
        if task.method_name == CLASSIFY_METHOD_NAME:
            task_input, task_outputs = preprocess_classification(signature, method_name_check)
        elif task.method_name == REGRESS_METHOD_NAME:
            task_input, task_outputs = preprocess_regression(signature, method_name_check)
        else:
            raise ServingError(
                Code.UNIMPLEMENTED, f"Unsupported signature method_name: {task.method_name}"
            )
        if not input_name:
            input_name = task_input
        elif input_name != task_input:
            raise _invalid("Input tensor must be the same for all Signatures.")
        output_set.update(task_outputs)
        resolved.append((name, signature))
    # std::set order, as TF Serving builds output_tensor_names.
    output_names = tuple(sorted(output_set))
    examples = _require_examples(request.examples)

    def finish(outputs: Sequence[np.ndarray]) -> MultiInferenceResponse:
        results: list[ClassificationResponse | RegressionResponse] = []
        for task, (name, signature) in zip(request.tasks, resolved, strict=True):
            spec = _response_spec(task.model_spec.name, name, version)
            if task.method_name == CLASSIFY_METHOD_NAME:
                result = postprocess_classification(
                    signature, len(examples), output_names, outputs
                )
                results.append(ClassificationResponse(spec, result))
            else:
                values = postprocess_regression(signature, len(examples), output_names, outputs)
                results.append(RegressionResponse(spec, values))
        return MultiInferenceResponse(tuple(results))

    return InferenceCall(MULTI_INFERENCE_API, {input_name: examples}, output_names, finish)


class InferenceRunner:
    """Runs Classify, Regress and MultiInference on the manager's servables.

    The Examples go through a :class:`~serving.servables.tensorflow.serving_session.Session` (default: a
    :class:`~serving.servables.tensorflow.serving_session.DirectSession` on ``executor``), the same seam as Predict, so
    ``--enable_batching`` merges concurrent classify or regress calls too (TF Serving batches at
    its ``Session``, whatever the API). ``session_for(api)``, when given, is called once per API
    of :data:`INFERENCE_APIS` with its name and returns the Session that API runs through (the
    server wraps ``session`` per API in :class:`serving.util.metrics.MonitoredSession`, which records
    what TF Serving records per API); without it every API uses ``session``.
    ``method_name_check`` is ``--enable_signature_method_name_check``.
    """

    def __init__(
        self,
        manager: ServableManager,
        executor: BlockingExecutor,
        *,
        session: Session | None = None,
        session_for: Callable[[str], Session] | None = None,
        method_name_check: bool = False,
    ) -> None:
        self._manager = manager
        default: Session = session if session is not None else DirectSession(executor)
        self._sessions: dict[str, Session] = {
            api: session_for(api) if session_for is not None else default
            for api in INFERENCE_APIS
        }
        self._method_name_check = method_name_check

    async def classify(
        self, request: ExampleRequest, *, timeout_ms: int | None = None
    ) -> ClassificationResponse:
        """``TensorflowClassificationServiceImpl::Classify``: look the servable up, then
        :func:`prepare_classify`, one Session run, post-processing. Raises
        :class:`ServingError` (the lookup errors of :meth:`ServableManager.acquire`, then those of
        :func:`prepare_classify`, the run's, the post-processing checks').

        ``timeout_ms`` bounds the ``Session`` run (``RunOptions.timeout_in_ms``; ``None``: none).
        """
        with self._manager.acquire(request.model_spec) as handle:
            call = prepare_classify(
                handle.servable.signature_defs, request, handle.version, self._method_name_check
            )
            outputs = await self._run(handle, call, timeout_ms)
        return call.finish(outputs)

    async def regress(
        self, request: ExampleRequest, *, timeout_ms: int | None = None
    ) -> RegressionResponse:
        """``TensorflowRegressionServiceImpl::Regress``; see :meth:`classify`."""
        with self._manager.acquire(request.model_spec) as handle:
            call = prepare_regress(
                handle.servable.signature_defs, request, handle.version, self._method_name_check
            )
            outputs = await self._run(handle, call, timeout_ms)
        return call.finish(outputs)

    async def multi_inference(
        self, request: MultiInferenceRequest, *, timeout_ms: int | None = None
    ) -> MultiInferenceResponse:
        """``RunMultiInference``: the first task's spec picks the servable, then
        :func:`prepare_multi_inference` checks every task, one run fetches the union of their
        outputs, and each task is post-processed. Raises :class:`ServingError`.
        """
        first = request.tasks[0].model_spec if request.tasks else ModelSpec("")
        with self._manager.acquire(first) as handle:
            call = prepare_multi_inference(
                handle.servable.signature_defs, request, handle.version, self._method_name_check
            )
            outputs = await self._run(handle, call, timeout_ms)
        return call.finish(outputs)

    async def _run(
        self, handle: ServableHandle, call: InferenceCall[Any], timeout_ms: int | None
    ) -> list[np.ndarray]:
        """``PerformOneShotTensorComputation``: feed the Examples, fetch the outputs.

        If the caller is cancelled (a gRPC deadline, a client gone) the run is still awaited
        before the cancellation goes on, so the version stays referenced -- and cannot be
        unloaded -- while its ``Session`` is in use.
        """
        session = self._sessions[call.api]
        run = asyncio.ensure_future(
            session.run_tensors(handle, call.feeds, call.fetches, timeout_ms)
        )
        try:
            return await asyncio.shield(run)
        except asyncio.CancelledError:
            await asyncio.wait([run])
            raise


def _require_examples(examples: np.ndarray) -> np.ndarray:
    """``InputToSerializedExampleTensor``'s check, after the signature checks (TF's order)."""
    if len(examples) == 0:
        raise _invalid("Input is empty.")
    return examples


def _invalid(message: str) -> ServingError:
    return ServingError(Code.INVALID_ARGUMENT, message)


def _label_text(label: object) -> str:
    return label.decode("utf-8", "replace") if isinstance(label, bytes) else str(label)


def _response_spec(model_name: str, signature_name: str, version: int | None) -> ModelSpec:
    """``MakeModelSpec``: the request's name, the signature used, the version that ran (``None``:
    not known, as in a warmup replay)."""
    return ModelSpec(model_name, version=version, signature_name=signature_name)


def _debug_string(signature: SignatureDef) -> str:
    """``SignatureDef::DebugString()``: the text format."""
    return text_format.MessageToString(signature)


def _shape_string(array: np.ndarray) -> str:
    """``TensorShape::DebugString()``: ``[2,3]``."""
    return "[" + ",".join(str(size) for size in array.shape) + "]"


# ---- signature resolution (GetClassificationSignatureDef / GetRegressionSignatureDef) -------


def classification_signature(
    signatures: Mapping[str, SignatureDef], name: str, method_name_check: bool
) -> tuple[str, SignatureDef]:
    """``GetClassificationSignatureDef``: the named (default ``serving_default``) signature.

    With ``method_name_check`` its method must be classify; without, its layout is checked by
    :func:`preprocess_classification`. Returns ``(name used, signature)``.
    """
    return _example_signature(signatures, name, method_name_check, MethodName.CLASSIFY)


def regression_signature(
    signatures: Mapping[str, SignatureDef], name: str, method_name_check: bool
) -> tuple[str, SignatureDef]:
    """``GetRegressionSignatureDef``; see :func:`classification_signature`."""
    return _example_signature(signatures, name, method_name_check, MethodName.REGRESS)


def _example_signature(
    signatures: Mapping[str, SignatureDef], name: str, method_name_check: bool, method: MethodName
) -> tuple[str, SignatureDef]:
    used = name or DEFAULT_SIGNATURE
    signature = signatures.get(used)
    if signature is None:
        raise _invalid(f"No signature was found with the name: {used}")
    if method is MethodName.CLASSIFY:
        preprocess_classification(signature, method_name_check)
    else:
        preprocess_regression(signature, method_name_check)
    return used, signature


def _check_method(signature: SignatureDef, method: MethodName, method_name_check: bool) -> None:
    if method_name_check and signature.method_name != method.value:
        kind = "classification" if method is MethodName.CLASSIFY else "regression"
        raise _invalid(
            f"Expected {kind} signature method_name to be {method.value}. "
            f"Was: {signature.method_name}"
        )


def preprocess_classification(
    signature: SignatureDef, method_name_check: bool
) -> tuple[str, tuple[str, ...]]:
    """``PreProcessClassification``: the input tensor name and the output tensor names
    (``classes`` first, then ``scores``). Raises ``INVALID_ARGUMENT`` with TF Serving's messages.
    """
    _check_method(signature, MethodName.CLASSIFY, method_name_check)
    if len(signature.inputs) != 1:
        raise _invalid("Expected one input Tensor.")
    if len(signature.outputs) not in (1, 2):
        raise _invalid(f"Expected one or two output Tensors, found {len(signature.outputs)}")
    if _CLASSIFY_INPUTS not in signature.inputs:
        raise _invalid(
            f"No classification inputs found in SignatureDef: {_debug_string(signature)}"
        )
    outputs = [
        signature.outputs[key].name
        for key in (_CLASSIFY_OUTPUT_CLASSES, _CLASSIFY_OUTPUT_SCORES)
        if key in signature.outputs
    ]
    if not outputs:
        raise _invalid(
            "Expected classification signature outputs to contain at least one of "
            f'"{_CLASSIFY_OUTPUT_CLASSES}" or "{_CLASSIFY_OUTPUT_SCORES}". '
            f"Signature was: {_debug_string(signature)}"
        )
    return signature.inputs[_CLASSIFY_INPUTS].name, tuple(outputs)


def preprocess_regression(
    signature: SignatureDef, method_name_check: bool
) -> tuple[str, tuple[str, ...]]:
    """``PreProcessRegression``: the input tensor name and the ``outputs`` tensor name."""
    _check_method(signature, MethodName.REGRESS, method_name_check)
    if len(signature.inputs) != 1:
        raise _invalid("Expected one input Tensor.")
    if len(signature.outputs) != 1:
        raise _invalid("Expected one output Tensor.")
    if _REGRESS_INPUTS not in signature.inputs:
        raise _invalid(f"No regression inputs found in SignatureDef: {_debug_string(signature)}")
    if _REGRESS_OUTPUTS not in signature.outputs:
        raise _invalid(f"No regression outputs found in SignatureDef: {_debug_string(signature)}")
    return signature.inputs[_REGRESS_INPUTS].name, (signature.outputs[_REGRESS_OUTPUTS].name,)


# ---- results (PostProcessClassificationResult / PostProcessRegressionResult) ----------------


def postprocess_classification(
    signature: SignatureDef,
    num_examples: int,
    output_names: Sequence[str],
    outputs: Sequence[np.ndarray],
) -> ClassificationResult:
    """``PostProcessClassificationResult``: check and pick the ``classes``/``scores`` tensors.

    ``outputs[i]`` is the value of tensor ``output_names[i]``. Raises ``INVALID_ARGUMENT``
    (``Expected Tensor shape: [batch_size num_classes] but got [3]``, ``Expected classes Tensor
    of DT_STRING. Got: DT_FLOAT``, ``Expected scores output batch size of 2. Got: 1``, ...).
    """
    if len(outputs) != len(output_names):
        raise _invalid(f"Expected {len(output_names)} output tensor(s).  Got: {len(outputs)}")
    classes_name = (
        signature.outputs[_CLASSIFY_OUTPUT_CLASSES].name
        if _CLASSIFY_OUTPUT_CLASSES in signature.outputs
        else ""
    )
    scores_name = (
        signature.outputs[_CLASSIFY_OUTPUT_SCORES].name
        if _CLASSIFY_OUTPUT_SCORES in signature.outputs
        else ""
    )
    classes: np.ndarray | None = None
    scores: np.ndarray | None = None
    for name, value in zip(output_names, outputs, strict=True):
        if name == classes_name:
            classes = value
        elif name == scores_name:
            scores = value
    if classes is not None:
        _check_classification_tensor(classes, "classes", "DT_STRING", num_examples)
    if scores is not None:
        _check_classification_tensor(scores, "scores", "DT_FLOAT", num_examples)
    if classes is not None and scores is not None and classes.shape[1] != scores.shape[1]:
        raise _invalid(
            "Tensors class and score should match in dim_size(1). Got "
            f"{classes.shape[1]} vs. {scores.shape[1]}"
        )
    reference = classes if classes is not None else scores
    num_classes = int(reference.shape[1]) if reference is not None else 0
    return ClassificationResult(num_examples, num_classes, classes, scores)


def _check_classification_tensor(
    tensor: np.ndarray, what: str, dtype_name: str, num_examples: int
) -> None:
    if tensor.ndim != 2:
        raise _invalid(
            f"Expected Tensor shape: [batch_size num_classes] but got {_shape_string(tensor)}"
        )
    if data_type_name(tensor.dtype) != dtype_name:
        raise _invalid(
            f"Expected {what} Tensor of {dtype_name}. Got: {data_type_name(tensor.dtype)}"
        )
    if tensor.shape[0] != num_examples:
        raise _invalid(
            f"Expected {what} output batch size of {num_examples}. Got: {tensor.shape[0]}"
        )


def postprocess_regression(
    signature: SignatureDef,
    num_examples: int,
    output_names: Sequence[str],
    outputs: Sequence[np.ndarray],
) -> np.ndarray:
    """``PostProcessRegressionResult``: the ``outputs`` tensor as ``float32 [num_examples]``.

    Raises ``INVALID_ARGUMENT`` (``Expected output Tensor shape to be either [batch_size] or
    [batch_size, 1] but got [2,2]``, ``Input batch size did not match output batch size: 2 vs.
    1``, ``Expected output Tensor of DT_FLOAT.  Got: DT_INT32``, ...).
    """
    if len(outputs) != len(output_names):
        raise _invalid(
            "Expected output_tensors and output_tensor_names to have the same size."
        )
    if _REGRESS_OUTPUTS not in signature.outputs:
        raise ServingError(
            Code.FAILED_PRECONDITION,
            f"No regression outputs found in SignatureDef: {_debug_string(signature)}",
        )
    wanted = signature.outputs[_REGRESS_OUTPUTS].name
    tensor = next(
        (value for name, value in zip(output_names, outputs, strict=True) if name == wanted),
        None,
    )
    if tensor is None:
        raise _invalid(f"Could not find output tensor '{wanted}'")
    if not (tensor.ndim == 1 or (tensor.ndim == 2 and tensor.shape[1] == 1)):
        raise _invalid(
            "Expected output Tensor shape to be either [batch_size] or [batch_size, 1] but got "
            + _shape_string(tensor)
        )
    if tensor.shape[0] != num_examples:
        raise _invalid(
            "Input batch size did not match output batch size: "
            f"{num_examples} vs. {tensor.shape[0]}"
        )
    if data_type_name(tensor.dtype) != "DT_FLOAT":
        raise _invalid(
            f"Expected output Tensor of DT_FLOAT.  Got: {data_type_name(tensor.dtype)}"
        )
    if tensor.size != num_examples:
        raise _invalid(
            f"Expected output batch size to be {num_examples}.  Got: {tensor.size}"
        )
    return tensor.reshape(num_examples)
