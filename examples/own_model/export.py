"""Export a small SavedModel of your own: an iris classifier, for docs/own-model.md.

    .venv/bin/python examples/own_model/export.py /tmp/own-model/iris    # writes .../iris/1

A logistic regression fitted with scikit-learn on the iris measurements that ship inside
it (`load_iris()`, no download), exported with TensorFlow as TF Serving expects:
`<base_path>/<version>/saved_model.pb` with one `serving_default` signature,

    input  `measurements`   float32 [batch, 4]  sepal length, sepal width, petal length, petal width (cm)
    output `probabilities`  float32 [batch, 3]  softmax over setosa, versicolor, virginica

Any SavedModel with a serving signature is served the same way; this one stands in for yours.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from sklearn.datasets import load_iris
from sklearn.linear_model import LogisticRegression


def fit() -> LogisticRegression:
    """The classifier (lbfgs on the whole data set: the same weights on every run)."""
    data = load_iris()
    return LogisticRegression(max_iter=1000).fit(data.data, data.target)


def export(classifier: LogisticRegression, base_path: Path, version: int = 1) -> Path:
    """Write the SavedModel to `base_path/version`; returns that directory."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf  # only the export needs TensorFlow

    weights = tf.constant(classifier.coef_.T, dtype=tf.float32)  # [4, 3]
    bias = tf.constant(classifier.intercept_, dtype=tf.float32)  # [3]

    class Iris(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="measurements")])
        def serve(self, measurements: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"probabilities": tf.nn.softmax(tf.matmul(measurements, weights) + bias)}

    module = Iris()
    target = base_path / str(version)
    tf.saved_model.save(module, str(target), signatures={"serving_default": module.serve})
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base_path", type=Path, help="the model's base_path; the export goes to base_path/1")
    target = export(fit(), parser.parse_args().base_path)
    print(f"exported {target}")


if __name__ == "__main__":
    main()
