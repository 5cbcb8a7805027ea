"""Regress: TF Serving's ``servables/tensorflow/regressor.cc``, on serialized ``tf.Example`` inputs.

As :mod:`~serving.servables.tensorflow.classifier`, with a regression signature: one input
``inputs`` and one output ``outputs`` (DT_FLOAT ``[batch]`` or ``[batch, 1]``); with
``--enable_signature_method_name_check`` its ``method_name`` must be ``tensorflow/serving/regress``.
Errors are TF Serving's (``No signature was found with the name: <name>``, ``Input is empty.``,
``Expected output Tensor shape to be either [batch_size] or [batch_size, 1] but got [2,2]``, ...).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from tensorflow.core.protobuf.meta_graph_pb2 import SignatureDef

from serving.apis import ExampleRequest, RegressionResponse
from serving.servables.tensorflow.inference_call import (
    REGRESS_API,
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
from serving.util.errors import Code, ServingError
from serving.util.tensor_proto import data_type_name

__all__ = [
    "postprocess_regression",
    "prepare_regress",
    "preprocess_regression",
    "regression_signature",
]

# SignatureDef keys (signature_constants.h): kRegressInputs, kRegressOutputs.
_REGRESS_INPUTS = "inputs"
_REGRESS_OUTPUTS = "outputs"


def prepare_regress(
    signatures: Mapping[str, SignatureDef],
    request: ExampleRequest,
    version: int | None,
    method_name_check: bool,
) -> InferenceCall[RegressionResponse]:
    """``RunRegress`` up to the Session run (regressor.cc); see
    :func:`~serving.servables.tensorflow.classifier.prepare_classify`."""
    spec = request.model_spec
    name, signature = regression_signature(signatures, spec.signature_name, method_name_check)
    input_name, output_names = preprocess_regression(signature, method_name_check)
    examples = require_examples(request.examples)
    response_spec = make_model_spec(spec.name, name, version)

    def finish(outputs: Sequence[np.ndarray]) -> RegressionResponse:
        values = postprocess_regression(signature, len(examples), output_names, outputs)
        return RegressionResponse(response_spec, values)

    return InferenceCall(REGRESS_API, {input_name: examples}, output_names, finish)


def regression_signature(
    signatures: Mapping[str, SignatureDef], name: str, method_name_check: bool
) -> tuple[str, SignatureDef]:
    """``GetRegressionSignatureDef``: the named (default ``serving_default``) signature, checked
    by :func:`preprocess_regression`. Returns ``(name used, signature)``."""
    used, signature = find_signature(signatures, name)
    preprocess_regression(signature, method_name_check)
    return used, signature


def preprocess_regression(
    signature: SignatureDef, method_name_check: bool
) -> tuple[str, tuple[str, ...]]:
    """``PreProcessRegression``: the input tensor name and the ``outputs`` tensor name."""
    check_method_name(signature, MethodName.REGRESS, method_name_check)
    if len(signature.inputs) != 1:
        raise invalid("Expected one input Tensor.")
    if len(signature.outputs) != 1:
        raise invalid("Expected one output Tensor.")
    if _REGRESS_INPUTS not in signature.inputs:
        raise invalid(f"No regression inputs found in SignatureDef: {signature_debug_string(signature)}")
    if _REGRESS_OUTPUTS not in signature.outputs:
        raise invalid(f"No regression outputs found in SignatureDef: {signature_debug_string(signature)}")
    return signature.inputs[_REGRESS_INPUTS].name, (signature.outputs[_REGRESS_OUTPUTS].name,)


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
        raise invalid(
            "Expected output_tensors and output_tensor_names to have the same size."
        )
    if _REGRESS_OUTPUTS not in signature.outputs:
        raise ServingError(
            Code.FAILED_PRECONDITION,
            f"No regression outputs found in SignatureDef: {signature_debug_string(signature)}",
        )
    wanted = signature.outputs[_REGRESS_OUTPUTS].name
    tensor = next(
        (value for name, value in zip(output_names, outputs, strict=True) if name == wanted),
        None,
    )
    if tensor is None:
        raise invalid(f"Could not find output tensor '{wanted}'")
    if not (tensor.ndim == 1 or (tensor.ndim == 2 and tensor.shape[1] == 1)):
        raise invalid(
            "Expected output Tensor shape to be either [batch_size] or [batch_size, 1] but got "
            + shape_string(tensor)
        )
    if tensor.shape[0] != num_examples:
        raise invalid(
            "Input batch size did not match output batch size: "
            f"{num_examples} vs. {tensor.shape[0]}"
        )
    if data_type_name(tensor.dtype) != "DT_FLOAT":
        raise invalid(
            f"Expected output Tensor of DT_FLOAT.  Got: {data_type_name(tensor.dtype)}"
        )
    if tensor.size != num_examples:
        raise invalid(
            f"Expected output batch size to be {num_examples}.  Got: {tensor.size}"
        )
    return tensor.reshape(num_examples)
