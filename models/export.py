"""Export a Keras model as a TF Serving servable: SavedModel + warmup records.

Shared by the example models' training scripts (`models.train_fraud`,
`models.train_digits`). A script exports into `staging_dir(version_dir)` and then
`publish`es it: the committed export is kept when the new one answers the probe inputs
identically, bit for bit (TensorFlow does not write the same SavedModel bytes twice: the
graph's nodes and the checkpoint's entries come out in another order on each run, so a
byte comparison would always differ). Bit for bit holds only between machines whose
kernels run the same instruction set (`models.kernels`) with the same releases of the
libraries training runs through (TensorFlow, Keras, NumPy, scikit-learn, Pillow: a new
release can change an initializer's draws, a resampling filter or a data split): each
export records both, and an export trained with other kernels or other releases is held
to a tolerance instead (`CrossKindTolerance`). Writes TF Serving's layout for one version:

    <version_dir>/saved_model.pb, variables/             the servable (tag "serve")
    <version_dir>/assets.extra/tf_serving_warmup_requests
                                                         PredictionLog records that TF
                                                         Serving replays at load time
                                                         with --enable_model_warmup
    <version_dir>/assets.extra/trained_on.json           the kernels' instruction set and
                                                         the libraries' releases it was
                                                         trained with (TF Serving ignores
                                                         other assets.extra files)
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2
from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

from models.kernels import kernel_isa

WARMUP_FILE = "tf_serving_warmup_requests"
WARMUP_BATCH_SIZES: tuple[int, ...] = (1, 8, 64)
TRAINED_ON_FILE = "trained_on.json"


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


@dataclass(frozen=True)
class CrossKindTolerance:
    """How close an export trained with another kind of kernels must come to the committed one.

    Between kinds (`models.kernels.kernel_isa` differs) the weights differ in their last
    bits and training carries that into the outputs, so the new export is compared by what
    it decides, not bit for bit: the committed export is kept when both decide alike on at
    least `min_agreement` of the probe rows and their outputs differ by at most
    `max_mean_abs_difference` on average.

    Attributes:
        decide: a model's outputs (output key -> [rows, ...] array) -> one decision per row
            (a class, a flag).
        min_agreement: fraction of probe rows, 0..1.
        max_mean_abs_difference: mean over every output element, in the outputs' own units.
    """

    decide: Callable[[Mapping[str, np.ndarray]], np.ndarray]
    min_agreement: float
    max_mean_abs_difference: float


def publish(
    staged: Path,
    version_dir: Path,
    *,
    signature_name: str,
    probe: Mapping[str, np.ndarray],
    tolerance: CrossKindTolerance,
) -> str:
    """Make `staged` the export at `version_dir`, unless the one there already answers alike.

    Both SavedModels run `signature_name` on `probe` (input key -> rows). When the committed
    export was trained with the same kernels as this process (`trained_on.json`), it is kept
    only when every output is equal to the last bit; when it was trained with another
    instruction set, it is kept when the outputs are within `tolerance`. Otherwise `staged`
    replaces it (renamed: atomic on one file system) with this machine's kernels recorded.

    Returns:
        what happened, one line for the script's output.
    """
    isa = kernel_isa()
    _write_trained_on(staged, isa)
    if not version_dir.exists():
        staged.rename(version_dir)
        return f"exported {version_dir} (kernels: {isa})"
    old, new = _outputs(version_dir, signature_name, probe), _outputs(staged, signature_name, probe)
    rows = len(next(iter(probe.values())))
    same_keys = old.keys() == new.keys() and all(old[k].shape == new[k].shape for k in old)
    if same_keys and all(np.array_equal(old[k], new[k]) for k in old):
        shutil.rmtree(staged)
        return f"kept {version_dir}: the new export's outputs are identical to the bit on {rows} probe rows"
    committed = trained_with(version_dir)
    here = trained_with(staged)
    if same_keys and committed and committed != here:
        agreement = float(np.mean(tolerance.decide(old) == tolerance.decide(new)))
        mean_abs = float(np.mean(np.concatenate([np.abs(old[k] - new[k]).ravel() for k in old])))
        if agreement >= tolerance.min_agreement and mean_abs <= tolerance.max_mean_abs_difference:
            shutil.rmtree(staged)
            return (
                f"kept {version_dir}: trained with other kernels or libraries ({_differences(committed, here)}), "
                f"the new export's outputs are within the cross-kind tolerance on {rows} probe rows "
                f"(decisions agree on {agreement:.2%}, mean |difference| {mean_abs:.2g} "
                f"<= {tolerance.max_mean_abs_difference:g})"
            )
    worst = max((float(np.max(np.abs(old[k] - new[k]))) for k in old if k in new and old[k].shape == new[k].shape),
                default=float("nan"))
    shutil.rmtree(version_dir)
    staged.rename(version_dir)
    return f"replaced {version_dir}: outputs differ from the previous export (max |difference| {worst:.3g})"


def trained_on(version_dir: Path) -> str | None:
    """The kernels' instruction set `version_dir` was trained with (`trained_on.json`), if recorded."""
    return trained_with(version_dir).get("kernel_isa")


def trained_with(version_dir: Path) -> dict[str, str]:
    """What `version_dir` was trained with (`trained_on.json`): "kernel_isa" and each recorded
    library's release ("tensorflow", "keras", ...); empty when nothing is recorded. An export
    recorded before the libraries were is read as such, so it never matches a full record."""
    path = version_dir / "assets.extra" / TRAINED_ON_FILE
    if not path.exists():
        return {}
    return {str(k): str(v) for k, v in json.loads(path.read_text()).items()}


#: The libraries whose releases can change what training produces (recorded with each export).
TRAINING_LIBRARIES = ("tensorflow", "keras", "numpy", "scikit-learn", "pillow")


def training_libraries() -> dict[str, str]:
    """This process's release of each of `TRAINING_LIBRARIES` that is installed."""
    releases: dict[str, str] = {}
    for name in TRAINING_LIBRARIES:
        try:
            releases[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return releases


def _differences(committed: Mapping[str, str], here: Mapping[str, str]) -> str:
    """"keras 3.15.1 (the export's: 3.14.0), ..." for every entry that differs."""
    keys = sorted(set(committed) | set(here), key=lambda k: (k != "kernel_isa", k))
    return "; ".join(
        f"{k} {here.get(k, 'unknown')} (the export's: {committed.get(k, 'not recorded')})"
        for k in keys
        if committed.get(k) != here.get(k)
    )


def _write_trained_on(version_dir: Path, isa: str) -> None:
    extra = version_dir / "assets.extra"
    extra.mkdir(parents=True, exist_ok=True)
    record = {"kernel_isa": isa, **training_libraries()}
    (extra / TRAINED_ON_FILE).write_text(json.dumps(record, indent=2) + "\n")


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
