"""The UCI handwritten digits as the `digits` example model sees them.

The data is the copy of the UCI "Optical Recognition of Handwritten Digits" test set
that ships inside scikit-learn's wheel (`sklearn.datasets.load_digits`: 1,797 images,
8×8, float 0..16, 16 = ink); nothing is downloaded. This module holds the fixed
train/test split and the renderer that turns an 8×8 grid back into a large picture,
shared by the training script and the tests. No TensorFlow here.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
from PIL import Image
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from examples.digits.images import INK_MAX, digit_grid

SEED = 20261129
TEST_FRACTION = 0.25


@dataclass(frozen=True)
class DigitsSplit:
    """Images float32 [n, 8, 8] in 0..16 and labels int64 [n] in 0..9."""

    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray


def load_split(seed: int = SEED, test_fraction: float = TEST_FRACTION) -> DigitsSplit:
    """The fixed, stratified train/test split of `load_digits()` (449 test images)."""
    data = load_digits()
    train_x, test_x, train_y, test_y = train_test_split(
        data.images.astype(np.float32),
        data.target.astype(np.int64),
        test_size=test_fraction,
        stratify=data.target,
        random_state=seed,
    )
    return DigitsSplit(train_x, train_y, test_x, test_y)


def render(grid: np.ndarray, *, scale: int = 32, light_background: bool = True) -> Image.Image:
    """Draw an 8×8 0..16 grid as an "L" image, each cell a `scale`×`scale` square.

    With `light_background` the digit is dark ink on white paper (as a photo or a
    scan would be); otherwise light on black, like the dataset itself.
    """
    levels = np.round(np.asarray(grid, dtype=np.float64) * 255.0 / INK_MAX).astype(np.uint8)
    if light_background:
        levels = 255 - levels
    side = levels.shape[0] * scale
    return Image.fromarray(levels).resize((side, side), Image.Resampling.NEAREST)


def encode(image: Image.Image, image_format: str = "PNG", **params: object) -> bytes:
    """The image's bytes in `image_format` ("PNG", "JPEG", ...), Pillow `save` params."""
    out = io.BytesIO()
    image.save(out, format=image_format, **params)
    return out.getvalue()


def as_served(images: np.ndarray) -> np.ndarray:
    """Each 8×8 grid after a trip through the API's preprocessing, float32 [n, 8, 8].

    The API crops every uploaded digit to its ink and centres it; dataset digits are
    not always centred left to right, so the model is trained on these too and its
    accuracy measured on what the API will actually send it.
    """
    return np.asarray(
        [np.asarray(digit_grid(render(x, scale=4)), dtype=np.float32)[:, :, 0] for x in images],
        dtype=np.float32,
    )
