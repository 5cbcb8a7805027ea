"""Classify/Regress: the pure signature checks and result checks, and the REST JSON codec.

End-to-end answers (real models, REST and gRPC) are in test_conformance.py; here are the
cases a well-formed model never produces (wrong output shapes and dtypes) and the JSON -> tf.Example
encoding byte for byte.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from tensorflow.core.example.example_pb2 import Example
from tensorflow.core.protobuf.meta_graph_pb2 import SignatureDef

from serving.apis import ClassificationResult
from serving.protos.tensorflow.core.example.example_pb2 import Example as ExampleOfOurs
from serving.servables.tensorflow.classifier import (
    classification_signature,
    postprocess_classification,
    preprocess_classification,
)
from serving.servables.tensorflow.inference_call import CLASSIFY_METHOD_NAME, REGRESS_METHOD_NAME
from serving.servables.tensorflow.regressor import postprocess_regression, preprocess_regression, regression_signature
from serving.util.errors import Code, ServingError
from serving.util.json_example import (
    decode_example_request,
    encode_classification_result,
    encode_regression_result,
)


def _signature(method: str, inputs: dict[str, str], outputs: dict[str, str]) -> SignatureDef:
    signature = SignatureDef(method_name=method)
    for alias, name in inputs.items():
        signature.inputs[alias].name = name
    for alias, name in outputs.items():
        signature.outputs[alias].name = name
    return signature


CLASSIFY = _signature(
    CLASSIFY_METHOD_NAME, {"inputs": "ex:0"}, {"classes": "c:0", "scores": "s:0"}
)
REGRESS = _signature(REGRESS_METHOD_NAME, {"inputs": "ex:0"}, {"outputs": "o:0"})
PREDICT = _signature("tensorflow/serving/predict", {"x": "x:0"}, {"y": "y:0"})


def _error(call: Any, *args: Any) -> ServingError:
    with pytest.raises(ServingError) as info:
        call(*args)
    return info.value


# ---- signatures ----------------------------------------------------------------------------


def test_preprocess_names_the_tensors() -> None:
    assert preprocess_classification(CLASSIFY, True) == ("ex:0", ("c:0", "s:0"))
    assert preprocess_regression(REGRESS, True) == ("ex:0", ("o:0",))
    scores_only = _signature(CLASSIFY_METHOD_NAME, {"inputs": "ex:0"}, {"scores": "s:0"})
    assert preprocess_classification(scores_only, False) == ("ex:0", ("s:0",))


def test_signature_lookup_and_method_check() -> None:
    signatures = {"serving_default": PREDICT, "c": CLASSIFY, "r": REGRESS}
    assert classification_signature(signatures, "c", True) == ("c", CLASSIFY)
    assert regression_signature(signatures, "r", False) == ("r", REGRESS)
    error = _error(classification_signature, signatures, "nope", False)
    assert (error.code, error.message) == (
        Code.INVALID_ARGUMENT,
        "No signature was found with the name: nope",
    )
    # --enable_signature_method_name_check: the method name decides.
    error = _error(classification_signature, signatures, "", True)
    assert error.message == (
        "Expected classification signature method_name to be tensorflow/serving/classify. "
        "Was: tensorflow/serving/predict"
    )
    error = _error(regression_signature, signatures, "c", True)
    assert error.message == (
        "Expected regression signature method_name to be tensorflow/serving/regress. "
        "Was: tensorflow/serving/classify"
    )
    # Without it (TF Serving's default) a regress-shaped signature of any method works...
    relabelled = SignatureDef()
    relabelled.CopyFrom(REGRESS)
    relabelled.method_name = "anything"
    assert regression_signature({"r": relabelled}, "r", False) == ("r", relabelled)
    # ... and the layout decides.
    error = _error(classification_signature, signatures, "", False)
    assert error.message.startswith("No classification inputs found in SignatureDef: inputs {")


@pytest.mark.parametrize(
    ("signature", "message"),
    [
        (_signature(CLASSIFY_METHOD_NAME, {}, {"scores": "s"}), "Expected one input Tensor."),
        (
            _signature(CLASSIFY_METHOD_NAME, {"inputs": "i"}, {"a": "a", "b": "b", "c": "c"}),
            "Expected one or two output Tensors, found 3",
        ),
        (
            _signature(CLASSIFY_METHOD_NAME, {"inputs": "i"}, {"probabilities": "p"}),
            'Expected classification signature outputs to contain at least one of "classes" or '
            '"scores". Signature was: ',
        ),
    ],
)
def test_classification_layout_errors(signature: SignatureDef, message: str) -> None:
    error = _error(preprocess_classification, signature, False)
    assert error.code is Code.INVALID_ARGUMENT
    assert error.message.startswith(message)


@pytest.mark.parametrize(
    ("signature", "message"),
    [
        (
            _signature(REGRESS_METHOD_NAME, {"inputs": "i"}, {"outputs": "o", "x": "x"}),
            "Expected one output Tensor.",
        ),
        (
            _signature(REGRESS_METHOD_NAME, {"examples": "i"}, {"outputs": "o"}),
            "No regression inputs found in SignatureDef: ",
        ),
        (
            _signature(REGRESS_METHOD_NAME, {"inputs": "i"}, {"y": "o"}),
            "No regression outputs found in SignatureDef: ",
        ),
    ],
)
def test_regression_layout_errors(signature: SignatureDef, message: str) -> None:
    assert _error(preprocess_regression, signature, False).message.startswith(message)


# ---- results -------------------------------------------------------------------------------


def test_postprocess_classification() -> None:
    classes = np.array([[b"a", b"b"], [b"c", b"d"]], dtype=object)
    scores = np.array([[0.1, 0.9], [0.7, 0.3]], np.float32)
    result = postprocess_classification(CLASSIFY, 2, ["c:0", "s:0"], [classes, scores])
    assert (result.num_examples, result.num_classes) == (2, 2)
    assert result.labels is classes and result.scores is scores


@pytest.mark.parametrize(
    ("classes", "scores", "message"),
    [
        (
            np.array([b"a", b"b"], dtype=object),
            None,
            "Expected Tensor shape: [batch_size num_classes] but got [2]",
        ),
        (np.zeros((2, 1), np.int32), None, "Expected classes Tensor of DT_STRING. Got: DT_INT32"),
        (None, np.zeros((2, 1), np.float64), "Expected scores Tensor of DT_FLOAT. Got: DT_DOUBLE"),
        (None, np.zeros((1, 1), np.float32), "Expected scores output batch size of 2. Got: 1"),
        (
            np.full((2, 3), b"x", dtype=object),
            np.zeros((2, 2), np.float32),
            "Tensors class and score should match in dim_size(1). Got 3 vs. 2",
        ),
    ],
)
def test_postprocess_classification_errors(
    classes: np.ndarray | None, scores: np.ndarray | None, message: str
) -> None:
    names = [n for n, v in (("c:0", classes), ("s:0", scores)) if v is not None]
    values = [v for v in (classes, scores) if v is not None]
    error = _error(postprocess_classification, CLASSIFY, 2, names, values)
    assert (error.code, error.message) == (Code.INVALID_ARGUMENT, message)


def test_postprocess_regression() -> None:
    values = postprocess_regression(REGRESS, 3, ["o:0"], [np.array([[1.0], [2.0], [3.0]], "f4")])
    np.testing.assert_array_equal(values, [1.0, 2.0, 3.0])


@pytest.mark.parametrize(
    ("output", "message"),
    [
        (
            np.zeros((2, 2), np.float32),
            "Expected output Tensor shape to be either [batch_size] or [batch_size, 1] but got "
            "[2,2]",
        ),
        (np.zeros(3, np.float32), "Input batch size did not match output batch size: 2 vs. 3"),
        (np.zeros(2, np.int32), "Expected output Tensor of DT_FLOAT.  Got: DT_INT32"),
    ],
)
def test_postprocess_regression_errors(output: np.ndarray, message: str) -> None:
    error = _error(postprocess_regression, REGRESS, 2, ["o:0"], [output])
    assert (error.code, error.message) == (Code.INVALID_ARGUMENT, message)


# ---- REST JSON <-> tf.Example ----------------------------------------------------------------


def _decode(doc: Any) -> tuple[str, list[Example]]:
    signature, examples = decode_example_request(json.dumps(doc).encode())
    return signature, [Example.FromString(e) for e in examples]


def test_json_features_become_typed_feature_lists() -> None:
    signature, (example,) = _decode(
        {
            "signature_name": "s",
            "examples": [
                {
                    "f": 1.5,
                    "fl": [1.0, 2.5e3],
                    "i": 3,
                    "il": [1, -2, True, False],
                    "s": "text",
                    "b": {"b64": "AP8="},
                    "mixed_bytes": ["a", {"b64": "Yg=="}],
                    "empty": [],
                }
            ],
        }
    )
    assert signature == "s"
    feature = example.features.feature
    assert list(feature["f"].float_list.value) == [1.5]
    assert list(feature["fl"].float_list.value) == [1.0, 2500.0]
    assert list(feature["i"].int64_list.value) == [3]
    assert list(feature["il"].int64_list.value) == [1, -2, 1, 0]
    assert list(feature["s"].bytes_list.value) == [b"text"]
    assert list(feature["b"].bytes_list.value) == [b"\x00\xff"]
    assert list(feature["mixed_bytes"].bytes_list.value) == [b"a", b"b"]
    assert feature["empty"].WhichOneof("kind") is None



def test_json_examples_are_what_tensorflow_would_build() -> None:
    """The codec's own tf.Example protos (serving/protos) speak TensorFlow's wire format."""
    (serialized,) = decode_example_request(
        json.dumps({"examples": [{"f": 1.5, "il": [1, -2], "s": "text", "empty": []}]}).encode()
    )[1]
    expected = Example()
    expected.features.feature["f"].float_list.value.append(1.5)
    expected.features.feature["il"].int64_list.value.extend([1, -2])
    expected.features.feature["s"].bytes_list.value.append(b"text")
    expected.features.feature["empty"].SetInParent()
    assert Example.FromString(serialized) == expected
    # Map entries may come in any order; with deterministic (sorted) output the bytes are equal.
    assert expected.SerializeToString(deterministic=True) == ExampleOfOurs.FromString(
        serialized
    ).SerializeToString(deterministic=True)


def test_json_context_is_prepended_to_each_example() -> None:
    body = {"context": {"c": 1.0, "x": 1.0}, "examples": [{"x": 2.0}, {}]}
    signature, examples = decode_example_request(json.dumps(body).encode())
    assert signature == ""
    context = Example()
    context.features.feature["c"].float_list.value.append(1.0)
    context.features.feature["x"].float_list.value.append(1.0)
    own = Example()
    own.features.feature["x"].float_list.value.append(2.0)
    assert examples.tolist() == [
        context.SerializeToString() + own.SerializeToString(),
        context.SerializeToString(),
    ]
    merged = Example.FromString(examples[0])  # the example's x wins over the context's
    assert list(merged.features.feature["x"].float_list.value) == [2.0]
    assert list(merged.features.feature["c"].float_list.value) == [1.0]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "JSON Parse error: The document is empty"),
        (b"[]", "JSON Value: [] Is not object"),
        (
            b'{"signature_name": 1, "examples": []}',
            "not formatted correctly. 'signature_name' key must be a string value.",
        ),
        (
            b"{}",
            "JSON Value: {} When method is classify, key 'examples' is expected and was not found",
        ),
        (b'{"examples": 1}', "Expecting 'examples' value to be an list/array"),
        (b'{"examples": []}', "'examples' value is an empty array"),
        (b'{"examples": [1]}', "Example must be JSON object but got JSON Number"),
        (b'{"examples": [{"x": true, "y": 1}], "context": 1}', "but got JSON Number"),
        (b'{"examples": [{"x": {"a": 1}}]}', "x has element with unexpected JSON type: Object"),
        (b'{"examples": [{"x": [1, 1.5]}]}', "element type in feature: x expecting type: int64"),
        (b'{"examples": [{"x": ["a", 1]}]}', "element type in feature: x expecting type: bytes"),
        (b'{"examples": [{"x": {"b64": "!"}}]}', "Unable to base64 decode"),
        (b'{"examples": [{"x": 18446744073709551615}]}', "Feature: x has uint64_t element."),
    ],
)
def test_json_errors(body: bytes, message: str) -> None:
    error = _error(decode_example_request, body)
    assert error.code is Code.INVALID_ARGUMENT
    assert message in error.message


def test_json_integers_beyond_64_bits_are_floats_like_rapidjson_doubles() -> None:
    _, (example,) = _decode({"examples": [{"x": 2**70}]})
    assert list(example.features.feature["x"].float_list.value) == [float(np.float32(2**70))]


def test_json_decimals_beyond_float_are_infinite() -> None:
    # json_tensor.cc AddValueToFeature: a double goes in with GetFloat() (no range check since
    # TF Serving 2.5), so 1e39 is +inf and 1e-50 is 0 in the float_list.
    _, (example,) = _decode({"examples": [{"x": [1e39, -1e39, 1e-50]}]})
    assert list(example.features.feature["x"].float_list.value) == [math.inf, -math.inf, 0.0]


def test_encode_classification_result() -> None:
    result = ClassificationResult(
        2,
        2,
        np.array([[b"cat", b"dog"], [b"\xff", b""]], dtype=object),
        np.array([[0.1, 0.9], [np.nan, np.inf]], np.float32),
    )
    body = encode_classification_result(result)
    assert body == (
        b'{"results":[[["cat",0.1],["dog",0.9]],[["\xef\xbf\xbd",NaN],["",Infinity]]]}'
    )
    scores_only = ClassificationResult(1, 1, None, np.array([[3.0]], np.float32))
    assert json.loads(encode_classification_result(scores_only)) == {"results": [[["", 3.0]]]}
    labels_only = ClassificationResult(1, 1, np.array([[b"a"]], dtype=object), None)
    assert json.loads(encode_classification_result(labels_only)) == {"results": [[["a", 0.0]]]}


def test_encode_regression_result() -> None:
    assert encode_regression_result(np.array([3.0, 0.1], np.float32)) == b'{"results":[3.0,0.1]}'
    error = _error(encode_regression_result, np.zeros(0, np.float32))
    assert error.message == "Cannot convert empty RegressionResults to JSON"
