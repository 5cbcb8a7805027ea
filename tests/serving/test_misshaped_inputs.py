"""Mis-shaped inputs to the example models are a 400, never a dead server.

With oneDNN's kernels (TensorFlow's default on x86) a rank-3 input to the digits CNN's
convolution aborts the process on a CHECK; the model server checks the shape of placeholders
of rank 3 or more before a run (``Servable._check_feed_shape``) and answers INVALID_ARGUMENT.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.support import Serving


@pytest.fixture(scope="module")
def serving(example_serving: Serving) -> Iterator[str]:
    example_serving.wait_available("digits")
    yield example_serving.rest_url


@pytest.mark.parametrize(
    "body",
    [
        {"instances": [[[0.0] * 8] * 8]},  # [1, 8, 8]: no channel dimension
        {"instances": [[0.0] * 64]},  # [1, 64]: flat
        {"inputs": {"image": []}},  # [0]
    ],
)
def test_a_misshaped_image_is_400_and_serving_lives_on(serving: str, body: dict) -> None:
    r = httpx.post(f"{serving}/v1/models/digits:predict", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert set(r.json()) == {"error"}
    # Still serving both models.
    ok = httpx.post(
        f"{serving}/v1/models/digits:predict",
        json={"instances": [[[[0.0]] * 8] * 8]},
        timeout=30,
    )
    assert ok.status_code == 200, ok.text
    assert len(ok.json()["predictions"][0]) == 10


def test_the_fraud_model_still_answers(serving: str) -> None:
    r = httpx.post(
        f"{serving}/v1/models/fraud:predict", json={"instances": [[0.0] * 11]}, timeout=30
    )
    assert r.status_code == 200, r.text
