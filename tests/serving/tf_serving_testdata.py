"""TF Serving's classic test models, exported here with TensorFlow's own SavedModel builder.

Rebuilt from ``tensorflow_serving/servables/tensorflow/testdata/saved_model_half_plus_two.py``
and ``saved_model_counter.py`` (nothing is downloaded). :func:`export_testdata` writes:

* ``half_plus_two/123`` -- a TF1 graph: a ``tf_example`` string placeholder parsed as features
  ``x`` and ``x2`` (float, ``[1]``; ``x2`` defaults to 0), ``y = 0.5 x + 2``, ``y2 = 0.5 x + 3``,
  ``y3 = 0.5 x2 + 3``. Signatures, as in TF Serving's testdata:

  - ``serving_default`` (predict): ``x`` -> ``y`` (``x`` is the parsed tensor, fed directly);
  - ``regress_x_to_y``, ``regress_x_to_y2`` (regress): serialized Examples -> ``outputs``;
  - ``classify_x_to_y`` (classify): serialized Examples -> ``scores``;
  - ``regress_x2_to_y3``, ``classify_x2_to_y3``: their input is the *float* tensor ``x2``, so
    feeding Examples fails in TensorFlow (TF Serving's own bad-signature cases);

  plus ``classify_x_to_classes_and_scores`` (ours): ``classes`` ``[["y", "y2"]]`` per example
  with ``scores`` ``[y, y2]``, to cover labels.
* ``half_plus_two_versions/1`` (``0.5 x + 2``) and ``/2`` (``0.5 x + 3``): the same graph, two
  versions (TF Serving's half_plus_two / half_plus_three pair).
* ``half_plus_two_tf2/1`` -- the same model as TF Serving's ``HalfPlusTwoModel`` (``tf2=True``,
  ``saved_model_half_plus_two_tf2_cpu``): a ``tf.Module`` saved with ``tf.saved_model.save``, each
  signature a function with its own input placeholder (``regress_x_to_y``, ``regress_x_to_y2``,
  ``classify_x_to_y`` take serialized Examples; ``regress_x2_to_y3`` / ``classify_x2_to_y3`` a
  float; ``serving_default`` ``x`` -> ``y``). Its method names are all predict, so classify and
  regress run on it with the method-name check off (TF Serving's default).
* ``counter/1`` -- ``saved_model_counter``: a float variable and the signatures
  ``get_counter``, ``incr_counter``, ``incr_counter_by`` (input ``delta``) and
  ``reset_counter``, each with output ``output`` (the counter's value after the op).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

HALF_PLUS_TWO_VERSION = 123  # TF Serving's testdata version directory


def _half_plus(path: Path, b: float) -> None:
    import tensorflow as tf

    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        a_var = v1.Variable(0.5, name="a")
        b_var = v1.Variable(b, name="b")
        c_var = v1.Variable(b + 1.0, name="c")
        serialized = v1.placeholder(tf.string, shape=[None], name="tf_example")
        parsed = v1.io.parse_example(
            serialized,
            {
                "x": v1.io.FixedLenFeature([1], tf.float32),
                "x2": v1.io.FixedLenFeature([1], tf.float32, default_value=[0.0]),
            },
        )
        x = tf.identity(parsed["x"], name="x")
        y = tf.add(tf.multiply(a_var, x), b_var, name="y")
        y2 = tf.add(tf.multiply(a_var, x), c_var, name="y2")
        x2 = tf.identity(parsed["x2"], name="x2")
        y3 = tf.add(tf.multiply(a_var, x2), c_var, name="y3")
        labels = tf.tile(tf.constant([["y", "y2"]]), tf.stack([tf.shape(y)[0], 1]))
        both_scores = tf.concat([y, y2], axis=1)

        info = v1.saved_model.utils.build_tensor_info
        build = v1.saved_model.signature_def_utils.build_signature_def
        classify = "tensorflow/serving/classify"
        regress = "tensorflow/serving/regress"
        signatures = {
            "serving_default": build(
                {"x": info(x)}, {"y": info(y)}, "tensorflow/serving/predict"
            ),
            "regress_x_to_y": build({"inputs": info(serialized)}, {"outputs": info(y)}, regress),
            "regress_x_to_y2": build(
                {"inputs": info(serialized)}, {"outputs": info(y2)}, regress
            ),
            "regress_x2_to_y3": build({"inputs": info(x2)}, {"outputs": info(y3)}, regress),
            "classify_x_to_y": build({"inputs": info(serialized)}, {"scores": info(y)}, classify),
            "classify_x2_to_y3": build({"inputs": info(x2)}, {"scores": info(y3)}, classify),
            "classify_x_to_classes_and_scores": build(
                {"inputs": info(serialized)},
                {"classes": info(labels), "scores": info(both_scores)},
                classify,
            ),
        }
        _save(graph, path, signatures)


def _half_plus_two_tf2(path: Path) -> None:
    import tensorflow as tf

    features = {
        "x": tf.io.FixedLenFeature([1], dtype=tf.float32),
        "x2": tf.io.FixedLenFeature([1], dtype=tf.float32, default_value=[0.0]),
    }
    examples = tf.TensorSpec([None], dtype=tf.string, name="inputs")

    class HalfPlusTwoModel(tf.Module):
        def __init__(self) -> None:
            self.a = tf.Variable(0.5, name="a")
            self.b = tf.Variable(2.0, name="b")
            self.c = tf.Variable(3.0, name="c")

        def compute(self, x: Any, inc: Any) -> Any:
            return tf.add(tf.multiply(self.a, x), inc)

        @tf.function(input_signature=[tf.TensorSpec(shape=[1], dtype=tf.float32)])
        def predict(self, x: Any) -> Any:
            return {"y": self.compute(x, self.b)}

        @tf.function(input_signature=[examples])
        def regress_xy(self, serialized: Any) -> Any:
            x = tf.io.parse_example(serialized, features)["x"]
            return {"outputs": self.compute(x, self.b)}

        @tf.function(input_signature=[examples])
        def regress_xy2(self, serialized: Any) -> Any:
            x = tf.io.parse_example(serialized, features)["x"]
            return {"outputs": self.compute(x, self.c)}

        @tf.function(input_signature=[tf.TensorSpec([1], dtype=tf.float32, name="inputs")])
        def regress_x2y3(self, x2: Any) -> Any:
            return {"outputs": self.compute(x2, self.c)}

        @tf.function(input_signature=[examples])
        def classify_xy(self, serialized: Any) -> Any:
            x = tf.io.parse_example(serialized, features)["x"]
            return {"scores": self.compute(x, self.b)}

    model = HalfPlusTwoModel()
    signatures = {
        "regress_x_to_y": model.regress_xy,
        "regress_x_to_y2": model.regress_xy2,
        "regress_x2_to_y3": model.regress_x2y3,
        "classify_x_to_y": model.classify_xy,
        "serving_default": model.predict,
    }
    tf.saved_model.save(model, str(path), signatures=signatures)


def _counter(path: Path) -> None:
    import tensorflow as tf

    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        counter = v1.Variable(0.0, dtype=tf.float32, name="counter")
        delta = v1.placeholder(tf.float32, shape=[], name="delta")

        def value_after(update: Any, name: str) -> Any:
            # A resource variable's update is an op; fetch its value read after the update.
            with tf.control_dependencies([update]):
                return tf.identity(counter.read_value(), name=name)

        incr = value_after(counter.assign_add(1.0, read_value=False), "incr_counter")
        incr_by = value_after(counter.assign_add(delta, read_value=False), "incr_counter_by")
        reset = value_after(counter.assign(0.0, read_value=False), "reset_counter")
        info = v1.saved_model.utils.build_tensor_info
        build = v1.saved_model.signature_def_utils.build_signature_def
        predict = "tensorflow/serving/predict"
        signatures = {
            "get_counter": build({}, {"output": info(counter.read_value())}, predict),
            "incr_counter": build({}, {"output": info(incr)}, predict),
            "incr_counter_by": build({"delta": info(delta)}, {"output": info(incr_by)}, predict),
            "reset_counter": build({}, {"output": info(reset)}, predict),
        }
        _save(graph, path, signatures)


def _save(graph: Any, path: Path, signatures: dict[str, Any]) -> None:
    """Export `graph` to the version directory `path`, unless a run before did.

    The graphs here are fixed, so a version already exported is kept (TensorFlow's builder
    refuses a directory that exists). A version is written under a hidden name next to
    `path` and renamed into place, so an interrupted run leaves nothing a later run -- or a
    model server polling the folder -- takes for a whole version.
    """
    import tensorflow as tf

    if (path / "saved_model.pb").exists():
        return
    incoming = path.with_name(f".{path.name}.incoming")
    shutil.rmtree(incoming, ignore_errors=True)  # left by an interrupted run
    v1 = tf.compat.v1
    with v1.Session(graph=graph) as session:
        session.run(v1.global_variables_initializer())
        builder = v1.saved_model.builder.SavedModelBuilder(str(incoming))
        builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map=signatures)
        builder.save()
    incoming.rename(path)


def export_testdata(root: Path) -> Path:
    """Export the models of this module's docstring under ``root``; returns ``root``.

    Running it again on the same ``root`` keeps the versions already there."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    _half_plus(root / "half_plus_two" / str(HALF_PLUS_TWO_VERSION), 2.0)
    _half_plus(root / "half_plus_two_versions" / "1", 2.0)
    _half_plus(root / "half_plus_two_versions" / "2", 3.0)
    _half_plus_two_tf2(root / "half_plus_two_tf2" / "1")
    _counter(root / "counter" / "1")
    return root


def classic_models_config(root: Path) -> str:
    """A ``models.config`` for :func:`export_testdata`'s models.

    ``half_plus_two_versions`` serves both versions, labelled ``stable`` (1) and ``canary`` (2).
    """
    return (
        "model_config_list {\n"
        f'  config {{ name: "half_plus_two" base_path: "{root / "half_plus_two"}"'
        ' model_platform: "tensorflow" }\n'
        f'  config {{ name: "half_plus_two_versions" base_path: "{root / "half_plus_two_versions"}"'
        ' model_platform: "tensorflow"\n'
        "    model_version_policy { all {} }\n"
        '    version_labels { key: "stable" value: 1 }\n'
        '    version_labels { key: "canary" value: 2 }\n'
        "  }\n"
        f'  config {{ name: "counter" base_path: "{root / "counter"}"'
        ' model_platform: "tensorflow" }\n'
        f'  config {{ name: "half_plus_two_tf2" base_path: "{root / "half_plus_two_tf2"}"'
        ' model_platform: "tensorflow" }\n'
        "}\n"
    )
