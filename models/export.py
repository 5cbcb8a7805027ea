"""Export a Keras model as a TF Serving servable: SavedModel + warmup records.

Shared by the example models' training scripts (`models.train_fraud`,
`models.train_digits`). A script exports into `staging_dir(version_dir)` and then
`publish`es it: the committed export is kept when the new one answers the probe inputs
identically, bit for bit (TensorFlow does not write the same SavedModel bytes twice: the
graph's nodes and the checkpoint's entries come out in another order on each run, so a
byte comparison would always differ). Writes TF Serving's layout for one version:

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
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2
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
    frozen: bool = False,
) -> None:
    """Write `model` as a SavedModel with one named-input, named-output signature.

    The signature `signature_name` takes one tensor keyed `input_spec.name` (its dtype
    and shape, batch first) and returns `{output_name: model(x, training=False)}`.
    An existing `version_dir` is replaced.

    With `frozen`, the weights are frozen into the graph as constants: a TF1-style
    SavedModel (one `serve` MetaGraph, no variables) that TF Serving and `python -m serving`
    load the same way, far smaller for a deep model -- Keras' export of a 24-block
    `fraud_transformer` wrote 5.2 MiB (the graph several times over, every weight twice),
    the frozen one 1.9 MiB (the committed 48-block one: 2.7 MiB).

    Args:
        model: the trained Keras model (called in inference mode).
        version_dir: e.g. models/<name>/<version>.
        signature_name: the SignatureDef key, normally "serving_default".
        input_spec: e.g. `tf.TensorSpec([None, 11], tf.float32, name="features")`;
            its `name` becomes the signature's input key.
        output_name: the signature's output key.
        frozen: freeze the weights into the graph (see above).
    """
    if version_dir.exists():
        shutil.rmtree(version_dir)
    if frozen:
        _write_frozen(model, version_dir, signature_name, input_spec, output_name)
        return
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        name=signature_name,
        fn=lambda x: {output_name: model(x, training=False)},
        input_signature=[input_spec],
    )
    archive.write_out(str(version_dir), verbose=False)


def _write_frozen(
    model: keras.Model, version_dir: Path, signature_name: str, input_spec: tf.TensorSpec,
    output_name: str,
) -> None:
    function = tf.function(lambda x: {output_name: model(x, training=False)})
    frozen = convert_variables_to_constants_v2(function.get_concrete_function(input_spec))
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(frozen.graph.as_graph_def(), name="")
        inputs = {input_spec.name: graph.get_tensor_by_name(frozen.inputs[0].name)}
        outputs = {output_name: graph.get_tensor_by_name(frozen.outputs[0].name)}
        with tf.compat.v1.Session(graph=graph) as session:
            builder = tf.compat.v1.saved_model.Builder(str(version_dir))
            builder.add_meta_graph_and_variables(
                session,
                [tf.saved_model.SERVING],
                signature_def_map={
                    signature_name: tf.compat.v1.saved_model.predict_signature_def(inputs, outputs)
                },
                strip_default_attrs=True,
            )
            builder.save()


def staging_dir(version_dir: Path) -> Path:
    """Where to export before `publish`: beside `version_dir`, under a non-numeric name a
    polling model server ignores (README: publish a version atomically)."""
    return version_dir.parent / f".{version_dir.name}.incoming"


def publish(staged: Path, version_dir: Path, *, signature_name: str, probe: Mapping[str, np.ndarray]) -> str:
    """Make `staged` the export at `version_dir`, unless the one there already answers alike.

    Both SavedModels run `signature_name` on `probe` (input key -> rows); when every output
    is equal to the last bit, `version_dir` is kept and `staged` removed, else `staged`
    replaces it (renamed: atomic on one file system).

    Returns:
        what happened, one line for the script's output.
    """
    if version_dir.exists():
        old, new = _outputs(version_dir, signature_name, probe), _outputs(staged, signature_name, probe)
        if old.keys() == new.keys() and all(np.array_equal(old[k], new[k]) for k in old):
            shutil.rmtree(staged)
            rows = len(next(iter(probe.values())))
            return f"kept {version_dir}: the new export's outputs are identical to the bit on {rows} probe rows"
        worst = max(float(np.max(np.abs(old[k] - new[k]))) for k in old if k in new and old[k].shape == new[k].shape)
        shutil.rmtree(version_dir)
        staged.rename(version_dir)
        return f"replaced {version_dir}: outputs differ from the previous export (max |difference| {worst:.3g})"
    staged.rename(version_dir)
    return f"exported {version_dir}"


def _outputs(export_dir: Path, signature_name: str, probe: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    signature = tf.saved_model.load(str(export_dir)).signatures[signature_name]
    return {k: v.numpy() for k, v in signature(**{k: tf.constant(v) for k, v in probe.items()}).items()}


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
