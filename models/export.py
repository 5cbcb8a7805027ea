"""Export a Keras model as a TF Serving servable: SavedModel + warmup records.

Shared by the example models' training scripts (`models.train_fraud`,
`models.train_digits`). Writes TF Serving's layout for one version:

    <version_dir>/saved_model.pb, variables/             the servable (tag "serve")
    <version_dir>/assets.extra/tf_serving_warmup_requests
                                                         PredictionLog records that TF
                                                         Serving replays at load time
                                                         with --enable_model_warmup
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

WARMUP_FILE = "tf_serving_warmup_requests"
WARMUP_BATCH_SIZES: tuple[int, ...] = (1, 8, 64)


def export_servable(
    model: keras.Model,
    version_dir: Path,
    *,
    signature_name: str,
    input_spec: tf.TensorSpec,
    output_name: str,
) -> None:
    """Write `model` as a SavedModel with one named-input, named-output signature.

    The signature `signature_name` takes one tensor keyed `input_spec.name` (its dtype
    and shape, batch first) and returns `{output_name: model(x, training=False)}`.
    An existing `version_dir` is replaced.

    Args:
        model: the trained Keras model (called in inference mode).
        version_dir: e.g. models/<name>/<version>.
        signature_name: the SignatureDef key, normally "serving_default".
        input_spec: e.g. `tf.TensorSpec([None, 11], tf.float32, name="features")`;
            its `name` becomes the signature's input key.
        output_name: the signature's output key.
    """
    if version_dir.exists():
        shutil.rmtree(version_dir)
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        name=signature_name,
        fn=lambda x: {output_name: model(x, training=False)},
        input_signature=[input_spec],
    )
    archive.write_out(str(version_dir), verbose=False)


def write_warmup(
    version_dir: Path,
    *,
    model_name: str,
    signature_name: str,
    inputs: Mapping[str, np.ndarray],
    batch_sizes: Sequence[int] = WARMUP_BATCH_SIZES,
) -> None:
    """assets.extra/tf_serving_warmup_requests: one PredictLog per batch size.

    Format per TF Serving's SavedModel Warmup guide
    (tensorflow.org/tfx/serving/saved_model_warmup): a TFRecord file of
    `PredictionLog` protos (at most 1000 records), each a `PredictRequest` for
    `model_name` / `signature_name` whose input tensors are the first `batch` rows of
    each array in `inputs`.

    Args:
        version_dir: the exported version directory.
        model_name: the servable name the requests address.
        signature_name: the SignatureDef the requests call.
        inputs: input key -> example rows, batch first, at least max(batch_sizes) rows.
        batch_sizes: one record per size, so each batch shape is traced before traffic.
    """
    extra = version_dir / "assets.extra"
    extra.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(extra / WARMUP_FILE)) as writer:
        for batch in batch_sizes:
            request = predict_pb2.PredictRequest(
                model_spec=model_pb2.ModelSpec(name=model_name, signature_name=signature_name)
            )
            for key, rows in inputs.items():
                request.inputs[key].CopyFrom(tf.make_tensor_proto(rows[:batch]))
            log = prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request)
            )
            writer.write(log.SerializeToString())
