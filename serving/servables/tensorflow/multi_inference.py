"""MultiInference: TF Serving's ``servables/tensorflow/multi_inference.cc``.

Several classify/regress signatures of one model run in a single ``Session`` run, the request's
tf.Examples fed to the input tensor of every signature (``PerformOneShotTensorComputation`` with a
set of input tensor names): a TF1 graph's signatures usually share one placeholder, a TF2 export
gives each signature its own (``tensorflow_model_server_test.py`` ``testMultiInferenceTf2``). Each
task is checked and post-processed as :mod:`~serving.servables.tensorflow.classifier` and
:mod:`~serving.servables.tensorflow.regressor` do. (TF Serving refused signatures with different
input tensors, ``Input tensor must be the same for all Signatures.``, until 2021.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from tensorflow.core.protobuf.meta_graph_pb2 import SignatureDef

from serving.apis import (
    DEFAULT_SIGNATURE,
    ClassificationResponse,
    MultiInferenceRequest,
    MultiInferenceResponse,
    RegressionResponse,
)
from serving.servables.tensorflow.classifier import postprocess_classification, preprocess_classification
from serving.servables.tensorflow.inference_call import (
    CLASSIFY_METHOD_NAME,
    MULTI_INFERENCE_API,
    REGRESS_METHOD_NAME,
    InferenceCall,
    invalid,
    make_model_spec,
    require_examples,
)
from serving.servables.tensorflow.regressor import postprocess_regression, preprocess_regression
from serving.util.errors import Code, ServingError

__all__ = ["prepare_multi_inference"]


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
    signature: <s>``, ``Requested signature not found in model graph: <s>``, ``Input is
    empty.``; ``UNIMPLEMENTED`` ``Unsupported signature method_name: <m>``; and the
    classify/regress signature checks. An input tensor that cannot take serialized Examples fails
    in TensorFlow's run.
    """
    model_name = ""
    input_names: set[str] = set()
    seen: set[str] = set()
    resolved: list[tuple[str, SignatureDef]] = []
    output_set: set[str] = set()
    for task in request.tasks:
        if not task.model_spec.name:
            raise invalid("Found ModelSpec with an empty model name.")
        if not model_name:
            model_name = task.model_spec.name
        elif model_name != task.model_spec.name:
            raise invalid(
                "All ModelSpecs in a MultiInferenceRequest must access the same model name."
            )
        name = task.model_spec.signature_name or DEFAULT_SIGNATURE
        if name in seen:
            raise invalid(f"Duplicate evaluation of signature: {name}")
        seen.add(name)
        signature = signatures.get(name)
        if signature is None:
            raise invalid(f"Requested signature not found in model graph: {name}")
        if task.method_name == CLASSIFY_METHOD_NAME:
            task_input, task_outputs = preprocess_classification(signature, method_name_check)
        elif task.method_name == REGRESS_METHOD_NAME:
            task_input, task_outputs = preprocess_regression(signature, method_name_check)
        else:
            raise ServingError(
                Code.UNIMPLEMENTED, f"Unsupported signature method_name: {task.method_name}"
            )
        input_names.add(task_input)
        output_set.update(task_outputs)
        resolved.append((name, signature))
    # std::set order, as TF Serving builds output_tensor_names.
    output_names = tuple(sorted(output_set))
    examples = require_examples(request.examples)

    def finish(outputs: Sequence[np.ndarray]) -> MultiInferenceResponse:
        results: list[ClassificationResponse | RegressionResponse] = []
        for task, (name, signature) in zip(request.tasks, resolved, strict=True):
            spec = make_model_spec(task.model_spec.name, name, version)
            if task.method_name == CLASSIFY_METHOD_NAME:
                result = postprocess_classification(
                    signature, len(examples), output_names, outputs
                )
                results.append(ClassificationResponse(spec, result))
            else:
                values = postprocess_regression(signature, len(examples), output_names, outputs)
                results.append(RegressionResponse(spec, values))
        return MultiInferenceResponse(tuple(results))

    feeds = {name: examples for name in sorted(input_names)}  # std::set order
    return InferenceCall(MULTI_INFERENCE_API, feeds, output_names, finish)
