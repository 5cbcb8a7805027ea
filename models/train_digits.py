"""Train the `digits` example model and export it in TF Serving's layout.

    python -m models.train_digits [--output models/digits] [--version 1]

Data: the UCI handwritten digits shipped with scikit-learn (`models.digits_data`, no
download), a fixed stratified split (1,347 train / 450 test). The training set is used
twice: as the dataset has it, and after a trip through the API's own preprocessing
(`examples.digits.images.digit_grid`, which crops each digit to its ink and centres it), so the
model learns exactly what the API will send it. The script prints the held-out accuracy
on the test digits both ways and writes:

    <output>/<version>/saved_model.pb, variables/        the servable
    <output>/<version>/assets.extra/tf_serving_warmup_requests
                                                         PredictionLog records that
                                                         TF Serving replays with
                                                         --enable_model_warmup

Signature `serving_default` (stable, documented in the README):
    inputs:  image          float32 [batch, 8, 8, 1]  0..16, 16 = ink (the dataset's scale;
                                                      the model divides by 16 itself)
    outputs: probabilities  float32 [batch, 10]       softmax over the digits 0..9

Model: Rescaling(1/16) → Conv 3×3 16 → Conv 3×3 32 → max-pool 2×2 → dropout →
Dense 10 softmax. Seeds are fixed, ops deterministic and one thread, so on a machine whose
kernels run the instruction set the committed export was trained with (`models.kernels`) the
script reproduces it: the same outputs to the last float32 bit, which it checks before it
keeps the committed files (`models.export.publish`). On the other kind (AVX2 vs AVX-512) it
reproduces the accuracy and every digit's class, within `CROSS_KIND` (measured under
`ONEDNN_MAX_CPU_ISA=AVX2`: 900 of 900 probe rows classified alike, mean |difference| of the
probabilities 5.4e-4, max 0.32).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Fewer kernels that depend on the CPU: oneDNN's graph rewrites and custom ops off (before
# TensorFlow is imported). Matrix products still run on oneDNN's sgemm, which picks its code by
# the instruction set (models.kernels): that is what differs between kinds of CPU.
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from examples.digits.images import DIGIT_SIDE  # noqa: E402
from models.digits_data import SEED, as_served, load_split  # noqa: E402
from models.export import CrossKindTolerance, export_servable, publish, staging_dir, write_warmup  # noqa: E402

MODEL_NAME = "digits"
INPUT_NAME = "image"
OUTPUT_NAME = "probabilities"
SIGNATURE = "serving_default"
N_CLASSES = 10
INPUT_SHAPE = (DIGIT_SIDE, DIGIT_SIDE, 1)
# Between kinds of kernels: the same class for 99 % of the probe rows, and a mean difference
# of the probabilities ten times what was measured between AVX-512 and AVX2 (5.4e-4).
CROSS_KIND = CrossKindTolerance(
    decide=lambda outputs: np.argmax(outputs[OUTPUT_NAME], axis=1),
    min_agreement=0.99,
    max_mean_abs_difference=0.005,
)


def build_model() -> keras.Model:
    """[batch, 8, 8, 1] float32 0..16 → [batch, 10] softmax; normalisation inside."""
    inputs = keras.Input(shape=INPUT_SHAPE, name=INPUT_NAME, dtype="float32")
    h = keras.layers.Rescaling(1.0 / 16.0, name="normalize")(inputs)
    h = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(h)
    h = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(h)
    h = keras.layers.MaxPooling2D(2)(h)
    h = keras.layers.Flatten()(h)
    h = keras.layers.Dropout(0.3)(h)
    out = keras.layers.Dense(N_CLASSES, activation="softmax", name=OUTPUT_NAME)(h)
    model = keras.Model(inputs, out, name=MODEL_NAME)
    model.compile(
        optimizer=keras.optimizers.Adam(2e-3),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=Path("models/digits"))
    parser.add_argument("--version", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=40)
    args = parser.parse_args()

    keras.utils.set_random_seed(SEED)
    tf.config.experimental.enable_op_determinism()
    # One thread: a kernel may split a sum across its threads, so the thread count (the
    # machine's cores) would change the last bits of the weights.
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    split = load_split()
    train_x = np.concatenate([split.train_x, as_served(split.train_x)])[..., None]
    train_y = np.concatenate([split.train_y, split.train_y])
    test_raw = split.test_x[..., None]
    test_served = as_served(split.test_x)[..., None]
    print(f"train images {len(split.train_y)} (x2: as given and as served), "
          f"test images {len(split.test_y)}")

    model = build_model()
    model.fit(train_x, train_y, epochs=args.epochs, batch_size=32, shuffle=True, verbose=0)
    _, acc_raw = model.evaluate(test_raw, split.test_y, verbose=0)
    _, acc_served = model.evaluate(test_served, split.test_y, verbose=0)
    print(f"held-out accuracy: {acc_served:.4f} as the API preprocesses them, "
          f"{acc_raw:.4f} as the dataset has them ({len(split.test_y)} images)")

    version_dir = args.output / str(args.version)
    staged = staging_dir(version_dir)
    export_servable(
        model,
        staged,
        signature_name=SIGNATURE,
        input_spec=tf.TensorSpec([None, *INPUT_SHAPE], tf.float32, name=INPUT_NAME),
        output_name=OUTPUT_NAME,
    )
    write_warmup(
        staged,
        model_name=MODEL_NAME,
        signature_name=SIGNATURE,
        inputs={INPUT_NAME: test_served[:64]},
    )
    probe = {INPUT_NAME: np.concatenate([test_served, test_raw]).astype(np.float32)}
    print(publish(staged, version_dir, signature_name=SIGNATURE, probe=probe, tolerance=CROSS_KIND))
    print(f"signature {SIGNATURE}: {INPUT_NAME} -> {OUTPUT_NAME}")


if __name__ == "__main__":
    main()
