"""Cases from Triton's own HTTP conformance tests (its qa/L0_http), run against the OIP front.

Triton's tests that concern the protocol rather than Triton's models or its own extensions,
adapted to the models here (fraud's `features`, FP32 [-1, 11]):

* a body sent with chunked transfer encoding is read whole: `test_a_chunked_body_is_read_whole`;
* a shape whose element count overflows 64 bits is refused (400):
  `test_an_overflowing_element_count_is_refused`;
* a negative dimension is refused (Triton answers 500; the spec's status for a bad request is 400):
  `test_a_negative_dimension_is_refused`;
* data nested deeper than its shape, or than a JSON parser goes, is refused, never a crash:
  `test_deep_nesting_is_refused`;
* a body over the size limit is refused with a message: `test_malformed_requests_get_400_in_the_oip_shape`
  (test_clients.py).

Left out: Triton's "raw binary request" (`Inference-Header-Content-Length: 0` and a body that is one
input's bytes, its shape deduced from the model) is an extension of Triton's own, not of the protocol
or its binary tensor data extension; such a request is answered 400 (no JSON header).
"""

from __future__ import annotations

import json

import httpx
import numpy as np

from tests.oip.conftest import OipStack


def _infer(stack: OipStack, body: bytes, **headers: str) -> httpx.Response:
    return httpx.post(f"{stack.rest}/v2/models/fraud/infer", content=body, headers=headers, timeout=30)


def _expected(stack: OipStack, row: np.ndarray) -> list[float]:
    body = json.dumps({"inputs": [{"name": "features", "shape": [1, 11], "datatype": "FP32", "data": row.tolist()}]})
    answer = _infer(stack, body.encode())
    assert answer.status_code == 200, answer.text
    return list(answer.json()["outputs"][0]["data"])


def test_a_chunked_body_is_read_whole(oip_stack: OipStack) -> None:
    row = np.arange(11, dtype=np.float32) / 11
    header = json.dumps(
        {"inputs": [{"name": "features", "shape": [1, 11], "datatype": "FP32", "parameters": {"binary_data_size": 44}}]}
    ).encode()
    body = header + row.tobytes()

    def chunks():  # type: ignore[no-untyped-def]  # an iterator of bytes: httpx sends it chunked
        for start in range(0, len(body), 17):
            yield body[start : start + 17]

    answer = httpx.post(
        f"{oip_stack.rest}/v2/models/fraud/infer",
        content=chunks(),
        headers={"inference-header-content-length": str(len(header))},
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["data"] == _expected(oip_stack, row)


def test_an_overflowing_element_count_is_refused(oip_stack: OipStack) -> None:
    for shape in ([2**4, 2**60 + 2], [2**2, 2**60 + 2], [2**62, 2**62]):
        body = {"inputs": [{"name": "features", "shape": shape, "datatype": "FP32", "data": [1.0]}]}
        answer = _infer(oip_stack, json.dumps(body).encode())
        assert answer.status_code == 400 and "features" in answer.json()["error"], answer.text


def test_a_negative_dimension_is_refused(oip_stack: OipStack) -> None:
    body = {"inputs": [{"name": "features", "shape": [2, -5], "datatype": "FP32", "data": [1.0]}]}
    answer = _infer(oip_stack, json.dumps(body).encode())
    assert answer.status_code == 400 and "shape" in answer.json()["error"], answer.text


def test_deep_nesting_is_refused(oip_stack: OipStack) -> None:
    for depth in (120, 100_000):
        data = "[" * depth + "1.0" + "]" * depth
        body = f'{{"inputs": [{{"name": "features", "shape": [1, 11], "datatype": "FP32", "data": {data}}}]}}'
        answer = _infer(oip_stack, body.encode())
        assert answer.status_code in (400, 413), answer.text
        assert answer.json()["error"], answer.text
    # Nested as deep as the shape is fine (Triton's depth-50 case, here the model's rank 2).
    row = np.full(11, 0.5, np.float32)
    nested = {"inputs": [{"name": "features", "shape": [1, 11], "datatype": "FP32", "data": [row.tolist()]}]}
    answer = _infer(oip_stack, json.dumps(nested).encode())
    assert answer.status_code == 200 and answer.json()["outputs"][0]["data"] == _expected(oip_stack, row)
