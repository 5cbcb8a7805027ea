"""`POST /v1/digits/classify`: one uploaded image of a handwritten digit in, the digit out.

The image comes as the multipart form field `image` (PNG or JPEG, any size up to
`Settings.digits_max_image_bytes` and `Settings.digits_max_image_pixels`). It is
preprocessed into the UCI digits' 8×8, 0..16 format (`api.images`) and classified by
the `digits` model on the serving tier (`api.digits`).

Errors, all in the API's error shape (`api.errors`):
- 413 when the body is larger than `max_body_size(settings)` (the image limit plus
  multipart framing): answered by `api.middleware.RequestMiddleware`, to which the app
  factory gives this path that limit (`api.limits.Limits.path_body_limits`), from
  `Content-Length` before the body is read or as soon as a chunked body passes it
  (FastAPI parses and spools a multipart body before any endpoint code runs, so the
  limit must sit in front of it); and 413 here when the image itself, once parsed, is
  larger than the limit;
- 422 when the field is missing (FastAPI's validation), or the file is not a PNG/JPEG,
  is truncated or corrupt, has too many pixels, or shows no digit (FastAPI's
  validation-error format, `loc` `["body", "image"]`);
- 502/503/504 from the serving tier or the request's deadline.
"""

from __future__ import annotations

from functools import partial

import anyio.to_thread
from fastapi import APIRouter, File, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from starlette.responses import Response

from api.digits import DigitClassifier, DigitPrediction
from api.errors import error_response
from api.images import ImageError, preprocess_digit
from api.request_context import current_context
from api.schemas import ModelInfo
from api.settings import Settings

# Room for the multipart framing around the image (boundaries, part headers, a long
# filename) when the whole body is checked against the image size limit.
MULTIPART_ALLOWANCE_BYTES = 16 * 1024

_RESPONSES: dict[int | str, dict[str, str]] = {
    413: {"description": "The body or the image is larger than DIGITS_MAX_IMAGE_BYTES."},
    422: {"description": "No `image` field, or it is not a usable PNG/JPEG of a digit."},
    502: {"description": "Serving rejected the request."},
    503: {"description": "Serving is unreachable, failing or has no such model."},
    504: {"description": "Serving did not answer within the timeout."},
}


def max_body_size(settings: Settings) -> int:
    """Largest request body accepted on this router, bytes: the image limit plus framing."""
    return settings.digits_max_image_bytes + MULTIPART_ALLOWANCE_BYTES


router = APIRouter(prefix="/v1/digits", tags=["digits"])


def _invalid_image(upload: UploadFile, size: int, reason: str) -> RequestValidationError:
    """A 422 in FastAPI's validation-error format, located at the `image` form field."""
    return RequestValidationError(
        [
            {
                "type": "value_error",
                "loc": ("body", "image"),
                "msg": f"Value error, {reason}",
                "input": {
                    "filename": upload.filename,
                    "content_type": upload.content_type,
                    "size": size,
                },
                "ctx": {"error": reason},
            }
        ]
    )


@router.post("/classify", response_model=DigitPrediction, responses=_RESPONSES)
async def classify(
    request: Request,
    image: UploadFile = File(description="PNG or JPEG of one handwritten digit, any size."),
) -> DigitPrediction | Response:
    """Read the upload, preprocess it off the event loop, await serving, pick the argmax.

    Stages (`api.request_context`): `validate` (receiving and parsing the multipart
    body, before this runs), `features` (reading and preprocessing the image),
    `serving`.
    """
    ctx = current_context()
    ctx.stage_since_start("validate")
    settings: Settings = request.app.state.settings
    deadline = ctx.deadline
    limit = settings.digits_max_image_bytes
    with ctx.stage("features"):
        data = await image.read(limit + 1)
        if len(data) > limit:
            # Same status and code as the body-size middleware's 413 (`api.errors`).
            return error_response(413, "payload_too_large", f"image is larger than {limit} bytes")
        # Decoding and resizing are CPU work: 0.4 ms for a tiny PNG, ~1 ms at 256×256,
        # 20-50 ms for a multi-megapixel photo (measured; a thread hop costs ~0.15 ms),
        # so they always run in a worker thread. Pillow releases the GIL while it
        # decodes and resamples. The app's CPU limiter (one slot per usable CPU) bounds
        # how many decodes, and their decoded pixel buffers, are in memory at once.
        deadline.check("image decoding")
        try:
            grid = await anyio.to_thread.run_sync(
                partial(preprocess_digit, data, max_pixels=settings.digits_max_image_pixels),
                limiter=request.app.state.cpu_limiter,
            )
        except ImageError as exc:
            raise _invalid_image(image, len(data), str(exc)) from exc
    classifier: DigitClassifier = request.app.state.digit_classifier
    with ctx.stage("serving"):
        classes = await classifier.classify([grid], deadline)
    ctx.set_model(classifier.model_name, classes.version)
    probabilities = classes.probabilities[0]
    digit = max(range(len(probabilities)), key=probabilities.__getitem__)
    return DigitPrediction(
        digit=digit,
        probabilities=probabilities,
        model=ModelInfo(name=classifier.model_name, version=classes.version),
    )
