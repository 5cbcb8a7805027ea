"""TensorFlow's error text without its graph internals: what a serving failure may tell a caller.

TF Serving passes TensorFlow's status message through as it is (its REST `{"error": ...}`, its
gRPC details), and TensorFlow writes its graph into it: TF1 sessions end a kernel's message with
`\\n\\t [[{{node dense/MatMul}}]]` (older releases with the node's whole definition), TF2 functions
open it with `Graph execution error:` and `Detected at node 'x' defined at (most recent call
last):`, then the Python traceback of the model's export, `Node: 'x'`, and close it with
`[Op:__inference_...]` or `{{function_node __inference_...}}`. Node names, source paths and
function names are the model's internals, of no use to a caller; the kernel's own sentence
("Matrix size-incompatible: In[0]: [0,11], In[1]: [11,16]") is kept. Pure text work, no I/O.
"""

from __future__ import annotations

import re
from typing import Final

# Each pattern removes one construct of TensorFlow's error text (see module doc).
_TRACE_BLOCK: Final = re.compile(r"Detected at node\b.*?^\s*Node: '[^'\n]*'\s*$", re.DOTALL | re.MULTILINE)
_INTERNALS: Final = (
    # First: it may open a [[...]], as in "[[{{function_node f}}{{node x}}]]".
    re.compile(r"\{\{function_node [^}]*\}\}"),
    re.compile(r"\[\[\s*(?:\{\{)?node\b[^\n]*"),  # [[{{node x}}]], [[node x (defined at ...) ]], to the line's end
    re.compile(r"\[Op:[^\]]*\]"),
    re.compile(r"\(defined at [^)]*\)"),
    re.compile(r"^\s*(?:Detected at node|Node:)\b[^\n]*$", re.MULTILINE),
    re.compile(r"^\s*Graph execution error:", re.MULTILINE),
)
_MARKERS: Final = ("node", "Node:", "Op:", "defined at", "Graph execution error")
_SPACE: Final = re.compile(r"\s+")
#: What is said when nothing but internals was left.
EMPTY: Final = "the model failed to run the request"


def without_graph_internals(message: str) -> str:
    """`message` as one line without TensorFlow's node names, tracebacks and function names.

    A message that has none of them comes back unchanged; one that had them, with each run of
    whitespace made one space; `EMPTY` when nothing else was in it.
    """
    if not any(marker in message for marker in _MARKERS):
        return message
    text = _TRACE_BLOCK.sub(" ", message)
    for pattern in _INTERNALS:
        text = pattern.sub(" ", text)
    text = _SPACE.sub(" ", text).strip(" :")
    return text or EMPTY
