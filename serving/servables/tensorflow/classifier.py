"""Classify: TF Serving's ``servables/tensorflow/classifier.cc``, on serialized ``tf.Example`` inputs.

``RunClassify`` in three steps, with TF Serving's error codes and messages:

* the signature (``signature_name``, empty = ``serving_default``) must exist -- ``INVALID_ARGUMENT
  No signature was found with the name: <name>``; with ``--enable_signature_method_name_check`` its
  ``method_name`` must be ``tensorflow/serving/classify`` -- ``Expected classification signature
  method_name to be ...``. Without it (TF Serving's default) any signature of the right shape works:
  one input ``inputs`` (a string tensor fed with the serialized Examples) and the outputs
  ``classes`` (DT_STRING ``[batch, k]``) and/or ``scores`` (DT_FLOAT ``[batch, k]``);
* the request holds at least one Example -- ``INVALID_ARGUMENT Input is empty.``;
* one ``Session`` run feeds the Examples (with ``ExampleListWithContext`` each one is the
  serialized context followed by the serialized example: a protobuf merge in which the example's
  features win) and fetches the output tensors; their shapes and dtypes are then checked
  (``Expected Tensor shape: [batch_size num_classes] but got [3]``, ...).

:func:`prepare_classify` does the checks and names the tensors (an
:class:`~serving.servables.tensorflow.inference_call.InferenceCall`); the Session run and
:meth:`InferenceCall.finish <serving.servables.tensorflow.inference_call.InferenceCall.finish>`
(post-processing) are the caller's: :class:`~serving.servables.tensorflow.inference_runner.InferenceRunner`
for requests, :mod:`~serving.servables.tensorflow.saved_model_warmup` for warmup records.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from tensorflow.core.protobuf.meta_graph_pb2 import SignatureDef

from serving.apis import ClassificationResponse, ClassificationResult, ExampleRequest
from serving.servables.tensorflow.inference_call import (
    CLASSIFY_API,
    InferenceCall,
    MethodName,
    check_method_name,
    find_signature,
    invalid,
    make_model_spec,
    require_examples,
    shape_string,
    signature_debug_string,
)
from serving.util.tensor_proto import data_type_name

__all__ = [
    "classification_signature",
    "postprocess_classification",
    "prepare_classify",
    "preprocess_classification",
]

# SignatureDef keys (signature_constants.h): kClassifyInputs, kClassifyOutputClasses, ...
_CLASSIFY_INPUTS = "inputs"
_CLASSIFY_OUTPUT_CLASSES = "classes"
_CLASSIFY_OUTPUT_SCORES = "scores"


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
    examples = require_examples(request.examples)
    response_spec = make_model_spec(spec.name, name, version)

    def finish(outputs: Sequence[np.ndarray]) -> ClassificationResponse:
        result = postprocess_classification(signature, len(examples), output_names, outputs)
        return ClassificationResponse(response_spec, result)

    return InferenceCall(CLASSIFY_API, {input_name: examples}, output_names, finish)


def classification_signature(
    signatures: Mapping[str, SignatureDef], name: str, method_name_check: bool
) -> tuple[str, SignatureDef]:
    """``GetClassificationSignatureDef``: the named (default ``serving_default``) signature.

    With ``method_name_check`` its method must be classify; without, its layout is checked by
    :func:`preprocess_classification`. Returns ``(name used, signature)``.
    """
    used, signature = find_signature(signatures, name)
    preprocess_classification(signature, method_name_check)
    return used, signature


def preprocess_classification(
    signature: SignatureDef, method_name_check: bool
) -> tuple[str, tuple[str, ...]]:
    """``PreProcessClassification``: the input tensor name and the output tensor names
    (``classes`` first, then ``scores``). Raises ``INVALID_ARGUMENT`` with TF Serving's messages.
    """
    check_method_name(signature, MethodName.CLASSIFY, method_name_check)
    if len(signature.inputs) != 1:
        raise invalid("Expected one input Tensor.")
    if len(signature.outputs) not in (1, 2):
        raise invalid(f"Expected one or two output Tensors, found {len(signature.outputs)}")
    if _CLASSIFY_INPUTS not in signature.inputs:
        raise invalid(
            f"No classification inputs found in SignatureDef: {signature_debug_string(signature)}"
        )
    outputs = [
        signature.outputs[key].name
        for key in (_CLASSIFY_OUTPUT_CLASSES, _CLASSIFY_OUTPUT_SCORES)
        if key in signature.outputs
    ]
    if not outputs:
        raise invalid(
            "Expected classification signature outputs to contain at least one of "
            f'"{_CLASSIFY_OUTPUT_CLASSES}" or "{_CLASSIFY_OUTPUT_SCORES}". '
            f"Signature was: {signature_debug_string(signature)}"
        )
    return signature.inputs[_CLASSIFY_INPUTS].name, tuple(outputs)


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
        raise invalid(f"Expected {len(output_names)} output tensor(s).  Got: {len(outputs)}")
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
        raise invalid(
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
        raise invalid(
            f"Expected Tensor shape: [batch_size num_classes] but got {shape_string(tensor)}"
        )
    if data_type_name(tensor.dtype) != dtype_name:
        raise invalid(
            f"Expected {what} Tensor of {dtype_name}. Got: {data_type_name(tensor.dtype)}"
        )
    if tensor.shape[0] != num_examples:
        raise invalid(
            f"Expected {what} output batch size of {num_examples}. Got: {tensor.shape[0]}"
        )
