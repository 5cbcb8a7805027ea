"""The `digits` model's signature: preprocessed 8×8 grids in, class probabilities out.

Signature `serving_default` of models/digits (see models/train_digits.py):
    input  `image`          float32 [batch, 8, 8, 1], 0..16, 16 = ink (`api.images`)
    output `probabilities`  float32 [batch, 10], softmax over the digits 0..9

The call itself (version pinning, retry when the pinned version went away) is
`api.scoring.ServedModel`'s, shared with the fraud model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, Field

from api.deadlines import Deadline
from api.images import DIGIT_SIDE
from api.schemas import ModelInfo
from api.scoring import LatestVersion, ServedModel
from api.serving_client import DataType, ServingBadResponse, Tensor

DIGITS_INPUT = "image"
DIGITS_OUTPUT = "probabilities"
N_CLASSES = 10

Grid = Sequence[Sequence[Sequence[float]]]  # [8, 8, 1], as `api.images.digit_grid` returns


class DigitPrediction(BaseModel):
    """Response of `POST /v1/digits/classify`."""

    digit: int = Field(ge=0, le=9, description="The most probable digit.")
    probabilities: list[float] = Field(
        min_length=N_CLASSES,
        max_length=N_CLASSES,
        description="The model's softmax: probabilities[d] is P(digit = d); they sum to 1.",
    )
    model: ModelInfo


@dataclass(frozen=True)
class Classes:
    """Class probabilities for a batch of images and the version that produced them."""

    probabilities: list[list[float]]  # [n, N_CLASSES], each row sums to 1
    version: int


def images_tensor(images: Sequence[Grid]) -> Tensor:
    """[n, 8, 8, 1] float32 tensor from n grids of `api.images.digit_grid`.

    Raises:
        ValueError: no images, or a grid that is not 8×8×1.
    """
    flat: list[float] = []
    for grid in images:
        cells = [v for row in grid for cell in row for v in cell]
        if len(grid) != DIGIT_SIDE or len(cells) != DIGIT_SIDE * DIGIT_SIDE:
            raise ValueError(f"a digit grid must be {DIGIT_SIDE}×{DIGIT_SIDE}×1")
        flat.extend(cells)
    if not images:
        raise ValueError("a batch needs at least one image")
    return Tensor((len(images), DIGIT_SIDE, DIGIT_SIDE, 1), flat, DataType.DT_FLOAT)


class DigitClassifier:
    """Classifies preprocessed digit images with the `digits` model on serving."""

    def __init__(self, model: ServedModel) -> None:
        self.model = model
        self.model_name = model.model_name

    @property
    def latest(self) -> LatestVersion:
        """The model's version cache."""
        return self.model.latest

    async def classify(self, images: Sequence[Grid], deadline: Deadline) -> Classes:
        """Class probabilities for n images of shape [8, 8, 1] in 0..16.

        Returns:
            `Classes` with n rows of N_CLASSES probabilities.

        Raises:
            ServingBadResponse: the output is not [n, 10] finite numbers in [0, 1].
            ServingError subclasses from the client.
        """
        prediction = await self.model.predict(
            {DIGITS_INPUT: images_tensor(images)}, deadline, outputs=(DIGITS_OUTPUT,)
        )
        tensor = prediction.outputs[DIGITS_OUTPUT]
        if tuple(tensor.shape) != (len(images), N_CLASSES):
            raise ServingBadResponse(
                f"serving answered {DIGITS_OUTPUT} of shape {list(tensor.shape)} for "
                f"{len(images)} images (expected [{len(images)}, {N_CLASSES}])"
            )
        values: list[float] = []
        for value in tensor.values:
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or not 0.0 <= value <= 1.0
            ):
                raise ServingBadResponse(
                    f"serving answered a {DIGITS_OUTPUT} value that is not a probability: {value!r}"
                )
            values.append(float(value))
        rows = [values[i : i + N_CLASSES] for i in range(0, len(values), N_CLASSES)]
        return Classes(probabilities=rows, version=prediction.version)
