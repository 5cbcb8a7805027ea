"""The serving client's view of TensorFlow's error text: the kernel's sentence, never its graph."""

from __future__ import annotations

import pytest

from api.serving_client import ServingRejected
from api.serving_client._tf_messages import EMPTY, without_graph_internals

TF1 = "Matrix size-incompatible: In[0]: [0,11], In[1]: [11,16]\n\t [[{{node dense/MatMul}}]]"
TF1_OLD = (
    "Incompatible shapes: [2] vs. [3]\n\t [[node add (defined at /srv/export.py:12) = Add[T=DT_FLOAT]"
    "(x, y)]]"
)
TF2 = (
    "Graph execution error:\n\nDetected at node 'model/dense/MatMul' defined at (most recent call last):\n"
    '    File "/srv/export.py", line 3, in <module>\n      model(x)\nNode: \'model/dense/MatMul\'\n'
    "Matrix size-incompatible: In[0]: [1,0], In[1]: [11,16]\n\t [[{{node model/dense/MatMul}}]] "
    "[Op:__inference_serve_1234]"
)


@pytest.mark.parametrize(
    ("text", "told"),
    [
        (TF1, "Matrix size-incompatible: In[0]: [0,11], In[1]: [11,16]"),
        (TF1_OLD, "Incompatible shapes: [2] vs. [3]"),
        (TF2, "Matrix size-incompatible: In[0]: [1,0], In[1]: [11,16]"),
        (  # what serving answers for fraud given 2 features a row
            "Incompatible shapes: [1,2] vs. [1,11]\n\t [[{{function_node __inference_<lambda>_9977}}"
            "{{node fraud_1/normalize_1/Sub}}]]",
            "Incompatible shapes: [1,2] vs. [1,11]",
        ),
        ("{{function_node __inference_f_5}} [[{{node x}}]]", EMPTY),
        ("input size does not match signature: 2!=1 for inputs {x}", None),  # unchanged
    ],
)
def test_tensorflow_text_is_told_without_its_graph(text: str, told: str | None) -> None:
    assert without_graph_internals(text) == (text if told is None else told)


def test_a_serving_error_never_carries_graph_internals() -> None:
    error = ServingRejected(TF2)
    assert error.message == "Matrix size-incompatible: In[0]: [1,0], In[1]: [11,16]"
    assert "node" not in str(error)
