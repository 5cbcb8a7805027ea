"""TF Serving's JSON codec for the REST ``:classify`` and ``:regress`` APIs.

Follows ``FillClassificationRequestFromJson`` / ``FillRegressionRequestFromJson`` and
``MakeJsonFromClassificationResult`` / ``MakeJsonFromRegressionResult`` of
``tensorflow_serving/util/json_tensor.cc`` and ``g3doc/api_rest.md``; error messages are TF
Serving's, word for word (``INVALID_ARGUMENT``). It shares :mod:`serving.util.json_tensor`'s
rapidjson emulation (parsing, value rendering in messages, base64) so both speak one dialect.

Request body (other top-level keys are ignored)::

    {"signature_name": <string, optional>,
     "context": {<feature>: <value>|<list>, ...},          # optional, shared by all examples
     "examples": [{<feature>: <value>|<list>, ...}, ...]}  # non-empty

Each object becomes a ``tf.Example``; each member a ``Feature`` whose kind comes from its JSON
values (all values of one feature must agree):

=======================================  ======================================================
JSON value                               Feature
=======================================  ======================================================
integer (``1``), ``true`` / ``false``    ``int64_list`` (booleans as 1 / 0)
decimal (``1.0``, ``1e3``)               ``float_list`` (beyond float32's range: +/-Infinity)
string, ``{"b64": "..."}``               ``bytes_list`` (UTF-8 / base64-decoded bytes)
``[]``                                   a Feature with no kind (parses as missing)
=======================================  ======================================================

``null``, nested lists and other objects are rejected. With a ``context``, every serialized
example is the serialized context followed by the example (``ExampleListWithContext``): the model
sees the context's features plus the example's, the example winning on a name clash.

Traps kept from TF Serving, on purpose:

* ``{"x": 2}`` is an *int64* feature: a model parsing ``x`` as float fails (TensorFlow's
  ``Data types don't match`` error, 400). Write ``2.0``.
* a missing ``examples`` key is reported as ``When method is classify, key 'examples' is expected
  and was not found`` by ``:regress`` too.
* responses are keyed ``"results"`` -- what ``tensorflow_model_server`` writes
  (``kClassifyRegressResponseKey``, and what TF Serving's own REST tests expect) -- while
  ``api_rest.md`` shows ``"result"``. A client written against the doc's key breaks on the real
  server as it does here.

Responses::

    classify: {"results": [[[<label>, <score>], ...], ...]}  # per example, per class
    regress:  {"results": [<value>, ...]}                     # per example

A label is ``""`` when the signature has no ``classes`` output, a score ``0.0`` when it has no
``scores`` output; scores and values are float32 written with the shortest round-tripping text
(TF Serving's ``%.6g``-then-``%.9g``: the same numbers, occasionally spelled differently) and
``NaN`` / ``Infinity`` as bare tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from serving.apis import ClassificationResult
from serving.protos.tensorflow.core.example.example_pb2 import Example
from serving.protos.tensorflow.core.example.feature_pb2 import Feature
from serving.util.errors import Code, ServingError

# Shared rapidjson emulation of the predict codec (same module family as json_tensor.cc).
from serving.util.json_tensor import (
    _INT64_MAX,
    _INT64_MIN,
    _NUMPY_OPTS,
    _UINT64_MAX,
    _b64decode,
    _format_error,
    _is_b64_object,
    _json_type_string,
    _jsonable,
    _utf8,
    parse_json,
    signature_name,
)

__all__ = [
    "decode_example_request",
    "encode_classification_result",
    "encode_regression_result",
]

_CONTEXT_KEY = "context"
_EXAMPLES_KEY = "examples"
_RESULTS_KEY = "results"
_KIND_NAMES = {"bytes_list": "bytes", "float_list": "float", "int64_list": "int64"}


def _invalid(message: str) -> ServingError:
    return ServingError(Code.INVALID_ARGUMENT, message)


def decode_example_request(body: bytes) -> tuple[str, np.ndarray]:
    """``FillClassifyRegressRequestFromJson``: the signature name and the serialized Examples.

    Returns ``(signature_name or "", examples)`` where ``examples`` is a 1-D ``object`` array of
    ``bytes`` (context prepended). Raises ``INVALID_ARGUMENT`` with TF Serving's messages, e.g.
    ``JSON Value: {...} 'examples' value is an empty array``, ``Example must be JSON object but
    got JSON Array``, ``Feature: x has element with unexpected JSON type: Null``, ``Unexpected
    element type in feature: x expecting type: float``.
    """
    doc = parse_json(body)
    signature = signature_name(doc)
    context: bytes | None = None
    if _CONTEXT_KEY in doc:
        context = _make_example(doc[_CONTEXT_KEY]).SerializeToString()
    if _EXAMPLES_KEY not in doc:
        raise _format_error(
            doc, f"When method is classify, key '{_EXAMPLES_KEY}' is expected and was not found"
        )
    items = doc[_EXAMPLES_KEY]
    if type(items) is not list:
        raise _format_error(doc, f"Expecting '{_EXAMPLES_KEY}' value to be an list/array")
    if not items:
        raise _format_error(doc, f"'{_EXAMPLES_KEY}' value is an empty array")
    serialized = [_make_example(item).SerializeToString() for item in items]
    if context is not None:
        serialized = [context + example for example in serialized]
    examples = np.empty(len(serialized), dtype=object)
    examples[:] = serialized
    return signature, examples


def _make_example(value: Any) -> Example:
    """``MakeExampleFromJsonObject``."""
    if type(value) is not dict:
        raise _invalid(f"Example must be JSON object but got JSON {_json_type_string(value)}")
    example = Example()
    features = example.features.feature
    for name, content in value.items():
        features[name].CopyFrom(_make_feature(name, content))
    return example


def _make_feature(name: str, content: Any) -> Feature:
    """One member: a value or a flat list of values, all of one kind (``AddValueToFeature``)."""
    values = content if type(content) is list else [content]
    kind = ""
    converted: list[Any] = []
    for item in values:
        item_kind, item_value = _feature_value(name, item)
        if kind and item_kind != kind:
            raise _invalid(
                f"Unexpected element type in feature: {name} expecting type: {_KIND_NAMES[kind]}"
            )
        kind = item_kind
        converted.append(item_value)
    feature = Feature()
    if kind:
        getattr(feature, kind).value.extend(converted)
    return feature


def _feature_value(name: str, item: Any) -> tuple[str, Any]:
    """The Feature kind one JSON value asks for, and the value to store."""
    kind = type(item)
    if kind is bool:
        return "int64_list", int(item)
    if kind is str:
        return "bytes_list", _utf8(item)
    if kind is dict and _is_b64_object(item):
        decoded = _b64decode(item["b64"])
        if decoded is None:
            raise _invalid("Unable to base64 decode")
        return "bytes_list", decoded
    if kind is int and _INT64_MIN <= item <= _UINT64_MAX:  # rapidjson's integer range
        if item > _INT64_MAX:
            raise _invalid(f"Feature: {name} has uint64_t element. Only int64_t is supported.")
        return "int64_list", item
    if kind is float:  # decimals, and integers beyond 64 bits (rapidjson doubles)
        # GetFloat(): rounded to float32, beyond its range +/-Infinity.
        with np.errstate(over="ignore"):
            return "float_list", float(np.float32(item))
    raise _invalid(
        f"Feature: {name} has element with unexpected JSON type: {_json_type_string(item)}"
    )


def encode_classification_result(result: ClassificationResult) -> bytes:
    """``MakeJsonFromClassificationResult``: ``{"results": [[[label, score], ...], ...]}``.

    Raises ``INVALID_ARGUMENT`` ``Cannot convert empty ClassificationResults to JSON``.
    """
    if result.num_examples == 0:
        raise _invalid("Cannot convert empty ClassificationResults to JSON")
    shape = (result.num_examples, result.num_classes)
    scores = _jsonable(
        "scores", result.scores if result.scores is not None else np.zeros(shape, np.float32)
    )
    rows = [
        [[label, score] for label, score in zip(label_row, score_row, strict=True)]
        for label_row, score_row in zip(result.label_texts(), scores, strict=True)
    ]
    return orjson.dumps({_RESULTS_KEY: rows}, option=_NUMPY_OPTS)


def encode_regression_result(values: np.ndarray) -> bytes:
    """``MakeJsonFromRegressionResult``: ``{"results": [v, ...]}`` for ``float32 [n]``.

    Raises ``INVALID_ARGUMENT`` ``Cannot convert empty RegressionResults to JSON``.
    """
    if values.size == 0:
        raise _invalid("Cannot convert empty RegressionResults to JSON")
    return orjson.dumps({_RESULTS_KEY: _jsonable("values", values)}, option=_NUMPY_OPTS)
