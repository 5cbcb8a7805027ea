"""Image preprocessing for the `digits` model: uploaded PNG/JPEG bytes in, an 8×8 grid out.

The `digits` model was trained on the UCI handwritten digits (the copy shipped with
scikit-learn, `sklearn.datasets.load_digits`): 8×8 grayscale, light strokes on a dark
background, each pixel a float in 0..16 where 16 is full ink (the dataset counted "on"
pixels in 4×4 blocks of normalised 32×32 bitmaps). Every digit there fills its frame
top to bottom and is centred left to right. This module maps an arbitrary photo or
drawing of one digit onto that format:

1. decode (PNG or JPEG only; dimensions checked from the header before any pixel is
   decoded, so a small file that would inflate to gigabytes is refused), apply the
   EXIF orientation, flatten transparency onto white, convert to 8-bit grayscale;
2. invert if the background is light (the border's median above mid-grey), so ink is
   high; subtract the background level;
3. crop to the bounding box of the ink, pad it to a square with background, keeping the
   aspect ratio and centring the digit;
4. resize to 8×8 by area averaging (`Image.Resampling.BOX`: each output pixel is the
   mean of the input pixels it covers, like the dataset's block counts);
5. scale to 0..16 so the darkest cell is 16 (the dataset's peak in 98 % of its digits),
   which makes the result independent of stroke width and contrast.

Pure functions on bytes and Pillow images: no web framework, no NumPy, no I/O. They are
CPU work (about 0.4 ms for a small drawing, 20-50 ms for a multi-megapixel photo), so
the API runs them off the event loop (see `api.routes.digits`).

Errors: everything a caller can get wrong (not an image, a format other than PNG or
JPEG, truncated or corrupt data, too many pixels, a blank image) raises `ImageError`,
whose message is safe to show to the caller.
"""

from __future__ import annotations

import io
import statistics
import struct
import zlib

from PIL import Image, ImageOps, UnidentifiedImageError

ACCEPTED_FORMATS: tuple[str, ...] = ("PNG", "JPEG")
DIGIT_SIDE = 8  # output grid: DIGIT_SIDE × DIGIT_SIDE
INK_MAX = 16.0  # value of full ink in the UCI digits

# A pixel belongs to the digit's bounding box when its ink (after background
# subtraction) is at least this fraction of the image's strongest ink. 1/20 keeps the
# dataset's faintest strokes (1/16 of full ink) while ignoring JPEG ringing and paper
# texture a few grey levels above the background.
INK_FRACTION = 0.05
# Below this much contrast between background and strongest ink (on 0..255) there is
# no digit to read: a blank or nearly uniform image.
MIN_CONTRAST = 24
# JPEG can decode at 1/2, 1/4 or 1/8 scale (DCT scaling), several times faster than full
# size. We ask for at least this many pixels on each side, far more than the 8×8 output
# needs even when the digit covers a small part of the photo.
JPEG_DRAFT_SIDE = 512
# Squares larger than this are first reduced by an integer factor in uint8 (cheap and
# small in memory) before the final float average down to 8×8.
REDUCE_TO_SIDE = 128

# Pillow raises these on truncated or corrupt data (PNG chunk errors are SyntaxError,
# truncated streams OSError, bad zlib data zlib.error, short headers struct.error).
_DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, struct.error, zlib.error)


class ImageError(ValueError):
    """The uploaded bytes are not a usable image of a digit; `str(exc)` says why."""


def decode_grayscale(data: bytes, *, max_pixels: int) -> Image.Image:
    """Decode PNG or JPEG bytes into an 8-bit grayscale ("L") image, upright.

    The header is read first and the image refused if width × height exceeds
    `max_pixels`, before any pixel data is decompressed (a decompression-bomb guard that
    does not depend on Pillow's process-wide `Image.MAX_IMAGE_PIXELS`). JPEGs are
    decoded at a reduced DCT scale when they are much larger than needed. Transparent
    pixels are composited onto white (drawings exported from a canvas are dark strokes
    on a transparent background); 16-bit grayscale is scaled, not clipped, to 8 bits.

    Args:
        data: the uploaded file's bytes.
        max_pixels: the largest width × height accepted.

    Returns:
        A loaded "L" image (uint8, 0 = black), EXIF orientation applied.

    Raises:
        ImageError: not PNG/JPEG, too many pixels, truncated or corrupt.
    """
    try:
        image = Image.open(io.BytesIO(data), formats=ACCEPTED_FORMATS)
    except UnidentifiedImageError as exc:
        raise ImageError("not a PNG or JPEG image") from exc
    except Image.DecompressionBombError as exc:
        raise ImageError(f"image has too many pixels (at most {max_pixels})") from exc
    except _DECODE_ERRORS as exc:
        raise ImageError(f"corrupt image header ({exc})") from exc
    width, height = image.size
    if width < 1 or height < 1:
        raise ImageError(f"image is empty ({width}×{height} pixels)")
    if width * height > max_pixels:
        raise ImageError(
            f"image is {width}×{height} = {width * height} pixels; at most {max_pixels} accepted"
        )
    try:
        if image.format == "JPEG":
            image.draft("L", (JPEG_DRAFT_SIDE, JPEG_DRAFT_SIDE))
        image.load()
        image = ImageOps.exif_transpose(image)
        return _to_gray(image)
    except _DECODE_ERRORS as exc:
        raise ImageError(f"truncated or corrupt {image.format} image ({exc})") from exc


def _to_gray(image: Image.Image) -> Image.Image:
    """Any decoded PNG/JPEG mode → "L"; transparency flattened onto white."""
    if image.mode.startswith("I;16") or image.mode == "I":
        # 16-bit grayscale PNG: Pillow's convert("L") would clip at 255, not scale.
        image = image.convert("I").point(lambda v: v * (1 / 257)).convert("L")
    if image.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in image.info:
        rgba = image.convert("RGBA")
        image = Image.alpha_composite(Image.new("RGBA", rgba.size, "white"), rgba)
    return image.convert("L")


def _border_median(gray: Image.Image) -> float:
    """Median of the outermost ring of pixels: the background level, 0..255."""
    width, height = gray.size
    ring: list[int] = []
    for box in ((0, 0, width, 1), (0, height - 1, width, height)):
        ring.extend(gray.crop(box).get_flattened_data())
    if height > 2:
        for box in ((0, 1, 1, height - 1), (width - 1, 1, width, height - 1)):
            ring.extend(gray.crop(box).get_flattened_data())
    return statistics.median(ring)


def digit_grid(gray: Image.Image) -> list[list[list[float]]]:
    """Map a grayscale image of one digit to the UCI digits format.

    Args:
        gray: an "L" image (e.g. from `decode_grayscale`), any size, ink dark or light.

    Returns:
        Nested lists of shape [8, 8, 1] (rows, columns, channel), float in 0..16,
        16 = full ink, the strongest cell exactly 16: the `image` input of the `digits`
        model's `serving_default` signature for one example.

    Raises:
        ImageError: no ink (blank or nearly uniform image).
    """
    background = _border_median(gray)
    light = background > 127  # light background: invert so that ink is high
    if light:
        background = 255 - background
    span = 255 - background  # >= 128
    # One lookup table does the inversion, the background subtraction and the stretch
    # back to 0..255 in a single pass over the pixels.
    ink = gray.point(
        [round(max(0, (255 - v if light else v) - background) * 255 / span) for v in range(256)]
    )
    _, strongest = ink.getextrema()
    if strongest < MIN_CONTRAST:
        raise ImageError("no digit found: the image is blank or has too little contrast")
    threshold = max(1, strongest * INK_FRACTION)
    box = ink.point([255 if v >= threshold else 0 for v in range(256)]).getbbox()
    assert box is not None  # the strongest pixel passes the threshold
    digit = ink.crop(box)
    side = max(digit.size)
    square = Image.new("L", (side, side), 0)
    square.paste(digit, ((side - digit.width) // 2, (side - digit.height) // 2))
    # Shrink big squares cheaply in uint8 first (an integer box average), keeping at
    # least REDUCE_TO_SIDE pixels a side; then average the rest in float ("F"), so a thin
    # stroke that covers a small fraction of a cell does not round to 0.
    factor = side // REDUCE_TO_SIDE
    if factor > 1:
        square = square.reduce(factor)
    small = square.convert("F").resize((DIGIT_SIDE, DIGIT_SIDE), Image.Resampling.BOX)
    values = list(small.get_flattened_data())
    scale = INK_MAX / max(values)  # > 0: the bounding box holds at least one ink pixel
    return [
        [[values[row * DIGIT_SIDE + col] * scale] for col in range(DIGIT_SIDE)]
        for row in range(DIGIT_SIDE)
    ]


def preprocess_digit(data: bytes, *, max_pixels: int) -> list[list[list[float]]]:
    """Uploaded PNG/JPEG bytes → the `digits` model's [8, 8, 1] input in 0..16.

    `decode_grayscale` then `digit_grid`; see those for details.

    Raises:
        ImageError: the bytes are not a usable image of a digit.
    """
    return digit_grid(decode_grayscale(data, max_pixels=max_pixels))
