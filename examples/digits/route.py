"""The digits example: `POST /v1/digits/classify`, one uploaded picture of a handwritten digit in, the digit out.

Declared with the API's extension point only (`api.model_routes`). The picture comes as
the multipart form field `image` (PNG or JPEG, any size up to the route's upload limit,
`MODELS__DIGITS__MAX_BODY_BYTES`, and `MODELS__DIGITS__MAX_IMAGE_PIXELS`). It is
preprocessed into the UCI digits' 8×8, 0..16 format (`images`) in a worker thread, and
classified by the `digits` model. A file that is not a usable PNG/JPEG of a digit is a
422 at `["body", "image"]`; the format is read from the bytes, whatever the part's
Content-Type says.

Signature `serving_default` of models/digits (see models/train_digits.py):
    input  `image`          float32 [batch, 8, 8, 1], 0..16, 16 = ink
    output `probabilities`  float32 [batch, 10], softmax over the digits 0..9
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from api.model_routes import (
    DataType,
    FileUpload,
    InvalidInput,
    ModelInfo,
    ModelRoute,
    Prediction,
    Signature,
    TensorSpec,
    Upload,
)
from examples.digits.images import DIGIT_SIDE, ImageError, preprocess_digit

N_CLASSES = 10


class DigitsOptions(BaseModel):
    """The digits route's own settings."""

    model_config = ConfigDict(extra="forbid")

    max_image_pixels: int = Field(
        default=4096 * 4096,
        ge=1,
        description="Largest width × height accepted, checked from the image header before decoding "
        "(decompression-bomb guard); larger is answered 422. A decode holds up to about 5 bytes per "
        "pixel (RGBA plus grayscale) while it runs.",
    )


class DigitPrediction(BaseModel):
    """Response of `POST /v1/digits/classify`."""

    digit: int = Field(ge=0, le=9, description="The most probable digit.")
    probabilities: list[float] = Field(
        min_length=N_CLASSES,
        max_length=N_CLASSES,
        description="The model's softmax: probabilities[d] is P(digit = d); they sum to 1.",
    )
    model: ModelInfo


def preprocess(upload: Upload, options: DigitsOptions) -> dict[str, list[list[list[float]]]]:
    """The picture as the model's 8×8×1 grid. CPU work: 0.4 ms for a small drawing, 20-50 ms
    for a multi-megapixel photo (measured), so the route runs it in a worker thread.

    Raises:
        InvalidInput: not a PNG/JPEG, truncated or corrupt, too many pixels, no digit.
    """
    try:
        return {"image": preprocess_digit(upload.data, max_pixels=options.max_image_pixels)}
    except ImageError as exc:
        raise InvalidInput(str(exc)) from exc


def postprocess(upload: Upload, prediction: Prediction, options: DigitsOptions) -> DigitPrediction:
    """The most probable digit and every digit's probability."""
    probabilities = [float(p) for p in prediction.outputs["probabilities"]]
    digit = max(range(N_CLASSES), key=probabilities.__getitem__)
    return DigitPrediction(digit=digit, probabilities=probabilities, model=prediction.model)


route: ModelRoute[Upload, DigitPrediction, DigitsOptions] = ModelRoute(
    name="digits",
    path="/v1/digits/classify",
    summary="Classify one uploaded picture of a handwritten digit.",
    request=FileUpload(
        field="image",
        description="PNG or JPEG of one handwritten digit, any size.",
        max_bytes=2 * 1024 * 1024,
    ),
    response=DigitPrediction,
    signature=Signature(
        model_name="digits",
        inputs={"image": TensorSpec(DataType.DT_FLOAT, (DIGIT_SIDE, DIGIT_SIDE, 1))},
        outputs={"probabilities": TensorSpec(DataType.DT_FLOAT, (N_CLASSES,), bounds=(0.0, 1.0))},
    ),
    preprocess=preprocess,
    postprocess=postprocess,
    options=DigitsOptions,
    preprocess_in_thread=True,
)
