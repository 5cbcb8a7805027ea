"""Helpers for the serving tests: tiny SavedModels exported here (no downloads).

:func:`export_models` writes, each under ``<name>/<version>/``:

* ``half_plus_two/1`` -- TF1 ``SavedModelBuilder``: ``y = 0.5 * x + 2``, ``x``/``y`` float32
  ``[-1]``;
* ``keras_half_plus_two/1`` -- Keras 3 ``model.export()``: input ``x`` float32 ``[-1, 1]``, output
  ``output_0``, same function;
* ``multi/1`` (``0.5x + 2``) and ``multi/2`` (``0.5x + 3``) -- two versions of one TF1 model;
* ``two_inputs/1`` -- TF1: ``a``, ``b`` float32 ``[-1]`` -> ``sum``, ``product``;
* ``strings/1`` -- TF1: ``text`` string ``[-1]`` -> ``echo`` and ``echo_bytes`` (the input) and
  ``length`` (int32);
* ``scalar_string/1`` -- TF1: ``x`` float32 ``[-1]`` -> ``y`` (``x + 1``) and ``label``, a rank-0
  string (``"half"``);
* ``broken/1`` -- a ``saved_model.pb`` that is not a SavedModel (its load fails).

And the model server on them: :func:`models_config` (a config file's text),
:func:`write_atomically`, :func:`start_test_serving`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tools.processes import Serving, start_serving


def _export_tf1(path: Path, build: Callable[[], tuple[dict[str, Any], dict[str, Any]]]) -> None:
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        inputs, outputs = build()
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            builder = tf.compat.v1.saved_model.builder.SavedModelBuilder(str(path))
            signature = tf.compat.v1.saved_model.signature_def_utils.predict_signature_def(
                inputs=inputs, outputs=outputs
            )
            builder.add_meta_graph_and_variables(
                session, ["serve"], signature_def_map={"serving_default": signature}
            )
            builder.save()


def _half_plus(b: float) -> Callable[[], tuple[dict[str, Any], dict[str, Any]]]:
    def build() -> tuple[dict[str, Any], dict[str, Any]]:
        import tensorflow as tf

        x = tf.compat.v1.placeholder(tf.float32, shape=[None], name="x")
        a_var = tf.Variable(0.5, name="a")
        b_var = tf.Variable(b, name="b")
        y = tf.add(tf.multiply(a_var, x), b_var, name="y")
        return {"x": x}, {"y": y}

    return build


def _two_inputs() -> tuple[dict[str, Any], dict[str, Any]]:
    import tensorflow as tf

    a = tf.compat.v1.placeholder(tf.float32, shape=[None], name="a")
    b = tf.compat.v1.placeholder(tf.float32, shape=[None], name="b")
    return {"a": a, "b": b}, {"sum": tf.add(a, b, name="sum"), "product": tf.multiply(a, b)}


def _strings() -> tuple[dict[str, Any], dict[str, Any]]:
    import tensorflow as tf

    text = tf.compat.v1.placeholder(tf.string, shape=[None], name="text")
    echo = tf.identity(text, name="echo")
    return {"text": text}, {
        "echo": echo,
        "echo_bytes": tf.identity(text, name="echo_bytes"),
        "length": tf.strings.length(text, name="length"),
    }


def _scalar_string() -> tuple[dict[str, Any], dict[str, Any]]:
    import tensorflow as tf

    x = tf.compat.v1.placeholder(tf.float32, shape=[None], name="x")
    return {"x": x}, {"y": tf.add(x, 1.0, name="y"), "label": tf.constant("half", name="label")}


def _export_keras(path: Path) -> None:
    import keras
    import numpy as np

    inputs = keras.Input(shape=(1,), name="x", dtype="float32")
    layer = keras.layers.Dense(1, name="y")
    model = keras.Model(inputs, layer(inputs))
    layer.set_weights([np.array([[0.5]], np.float32), np.array([2.0], np.float32)])
    model.export(str(path), verbose=False)


def export_models(root: Path) -> Path:
    """Export the models listed in this module's docstring under ``root``; returns ``root``."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    _export_tf1(root / "half_plus_two" / "1", _half_plus(2.0))
    _export_tf1(root / "multi" / "1", _half_plus(2.0))
    _export_tf1(root / "multi" / "2", _half_plus(3.0))
    _export_tf1(root / "two_inputs" / "1", _two_inputs)
    _export_tf1(root / "strings" / "1", _strings)
    _export_tf1(root / "scalar_string" / "1", _scalar_string)
    _export_keras(root / "keras_half_plus_two" / "1")
    broken = root / "broken" / "1"
    broken.mkdir(parents=True)
    (broken / "saved_model.pb").write_bytes(b"this is not a SavedModel")
    return root


def models_config_text(root: Path) -> str:
    """A ``models.config`` serving every model of ``serving_model_dir``.

    ``multi`` serves all its versions with labels ``stable`` -> 1 and ``canary`` -> 2.
    """
    simple = ["half_plus_two", "keras_half_plus_two", "two_inputs", "strings", "scalar_string", "broken"]
    entries = [
        f'  config {{ name: "{name}" base_path: "{root / name}" model_platform: "tensorflow" }}'
        for name in simple
    ]
    entries.append(
        f'  config {{ name: "multi" base_path: "{root / "multi"}" model_platform: "tensorflow"\n'
        "    model_version_policy { all {} }\n"
        '    version_labels { key: "stable" value: 1 }\n'
        '    version_labels { key: "canary" value: 2 }\n'
        "  }"
    )
    return "model_config_list {\n" + "\n".join(entries) + "\n}\n"


def models_config(entries: Sequence[tuple[str, Path, str]]) -> str:
    """A ``model_config_list`` of (name, base path, extra ModelConfig fields) entries."""
    configs = "".join(
        f'  config {{ name: "{name}" base_path: "{path}" model_platform: "tensorflow" {extra} }}\n'
        for name, path, extra in entries
    )
    return f"model_config_list {{\n{configs}}}\n"


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` in one rename, so a poll never reads half a file."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def start_test_serving(config_file: Path, log_file: Path, **flags: Any) -> Serving:
    """``python -m serving`` on ``config_file`` with ``flags``, one TensorFlow thread per pool and
    TensorFlow's C++ log at warnings (:func:`tools.processes.start_serving`; not waited for)."""
    return start_serving(
        log_file,
        env={"TF_CPP_MIN_LOG_LEVEL": "2"},
        model_config_file=config_file,
        tensorflow_intra_op_parallelism=1,
        tensorflow_inter_op_parallelism=1,
        **flags,
    )
