"""A SavedModel with a string and an int64 input, and one that echoes every OIP datatype.

    python -m tests.oip.dtypes_model DIR       # writes DIR/1 (skipped when it exists)

Exported with TensorFlow's SavedModelBuilder, as TF Serving's own test models are
(tests/serving/tf_serving_testdata.py). Signatures:

* ``serving_default``: ``text`` (DT_STRING ``[batch]``) and ``count`` (DT_INT64 ``[batch]``) ->
  ``length`` (DT_INT64, ``len(text) * 1000 + count``) and ``upper`` (DT_STRING, ``text`` upper-cased);
* ``echo``: one ``[batch, 2]`` input per datatype OIP has (``bool``, ``uint8`` ... ``int64``, ``half``,
  ``float``, ``double``, ``string``, ``bfloat16``), each answered as ``<name>_out``, itself;
* ``echo_rest``: the same for the datatypes TF Serving's REST API carries (all but ``half``,
  ``bfloat16`` and ``uint16``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Input name -> TensorFlow dtype name; the OIP datatype of each is in tests/oip/test_clients.py.
NOT_OVER_REST = ("half", "bfloat16", "uint16")
ECHO_DTYPES = {
    "bool": "bool",
    "uint8": "uint8",
    "uint16": "uint16",
    "uint32": "uint32",
    "uint64": "uint64",
    "int8": "int8",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "half": "float16",
    "float": "float32",
    "double": "float64",
    "string": "string",
    "bfloat16": "bfloat16",
}


def export(version_dir: Path) -> Path:
    """Write the SavedModel to `version_dir` (kept when it is already there)."""
    if (version_dir / "saved_model.pb").exists():
        return version_dir
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        text = v1.placeholder(tf.string, shape=[None], name="text")
        count = v1.placeholder(tf.int64, shape=[None], name="count")
        length = tf.add(tf.cast(tf.strings.length(text), tf.int64) * 1000, count, name="length")
        upper = tf.strings.upper(text, name="upper")
        info = v1.saved_model.utils.build_tensor_info
        build = v1.saved_model.signature_def_utils.build_signature_def
        predict = "tensorflow/serving/predict"
        echo_in, echo_out = {}, {}
        for name, dtype in ECHO_DTYPES.items():
            placeholder = v1.placeholder(tf.as_dtype(dtype), shape=[None, 2], name=name)
            echo_in[name] = info(placeholder)
            echo_out[f"{name}_out"] = info(tf.identity(placeholder, name=f"{name}_out"))
        signatures = {
            "serving_default": build(
                {"text": info(text), "count": info(count)}, {"length": info(length), "upper": info(upper)}, predict
            ),
            "echo": build(echo_in, echo_out, predict),
            "echo_rest": build(
                {k: v for k, v in echo_in.items() if k not in NOT_OVER_REST},
                {k: v for k, v in echo_out.items() if k.removesuffix("_out") not in NOT_OVER_REST},
                predict,
            ),
        }
        incoming = version_dir.with_name(f".{version_dir.name}.incoming")
        with v1.Session(graph=graph) as session:
            builder = v1.saved_model.builder.SavedModelBuilder(str(incoming))
            builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map=signatures)
            builder.save()
    incoming.rename(version_dir)
    return version_dir


if __name__ == "__main__":
    export(Path(sys.argv[1]) / "1")
