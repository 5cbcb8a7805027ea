"""Image preprocessing for the `digits` model: uploaded PNG/JPEG bytes in, an 8×8 grid out.

The `digits` model was trained on the UCI handwritten digits (the copy shipped with
scikit-learn, `sklearn.datasets.load_digits`): 8×8 grayscale, light strokes on a dark
background, each pixel a float in 0..16 where 16 is full ink (the dataset counted "on"
pixels in 4×4 blocks of normalised 32×32 bitmaps). Every digit there fills its frame
top to bottom and is centred left to right. This module maps an arbitrary photo or
drawing of one digit onto that format:

1. decode (PNG or JPEG only; dimensions checked from the header before any pixel is
   decoded, so a small file that would inflate to gigabytes is refused; a PNG whose
   pixel data is shorter than its header's size is refused as truncated, which Pillow
   does not do: it stops where a short but well-formed data stream ends and leaves the
   other rows black), apply the EXIF orientation, flatten transparency onto white,
   convert to 8-bit grayscale;
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
the route runs them off the event loop (`preprocess_in_thread`, `examples.digits.route`).

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

# PNG colour types (IHDR) -> samples per pixel (PNG spec, 11.2.2).
_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
# Adam7 passes: (first column, first row, column step, row step) (PNG spec, 8.2).
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))
_INFLATE_STEP = 1 << 20  # bytes of pixel data inflated at a time while counting them

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
    if image.format == "PNG":
        _check_png_data(data)
    try:
        if image.format == "JPEG":
            image.draft("L", (JPEG_DRAFT_SIDE, JPEG_DRAFT_SIDE))
        image.load()
        return _to_gray(ImageOps.exif_transpose(image))
    except _DECODE_ERRORS as exc:
        raise ImageError(f"truncated or corrupt {image.format} image ({exc})") from exc


def png_data_bytes(width: int, height: int, bit_depth: int, color_type: int, interlaced: bool) -> int:
    """Bytes of filtered pixel data a PNG of this header holds once inflated (PNG spec 7.2, 8.2).

    Raises:
        ImageError: a colour type the spec does not define.
    """
    try:
        bits = _PNG_CHANNELS[color_type] * bit_depth
    except KeyError:
        raise ImageError(f"corrupt PNG header (colour type {color_type})") from None
    passes = _ADAM7 if interlaced else ((0, 0, 1, 1),)
    total = 0
    for x0, y0, dx, dy in passes:
        cols, rows = -(-(width - x0) // dx), -(-(height - y0) // dy)
        if cols > 0 and rows > 0:
            total += rows * (1 + -(-cols * bits // 8))  # a filter-type byte starts each row
    return total


def _check_png_data(data: bytes) -> None:
    """Refuse a PNG whose IDAT stream inflates to less pixel data than its header declares.

    Counts the inflated bytes a megabyte at a time (never holding them) and stops once
    there are enough, before Pillow allocates the image (measured on a 4096 x 4096 PNG:
    22-31 ms, against 80-370 ms for Pillow's decode). Chunk CRCs are left to Pillow.

    Raises:
        ImageError: the data stream is short, corrupt, or its chunks are cut off.
    """
    try:
        width, height, bit_depth, color_type, _, _, interlace = struct.unpack_from(">IIBBBBB", data, 16)
        expected = png_data_bytes(width, height, bit_depth, color_type, interlace == 1)
        inflate = zlib.decompressobj()
        inflated = 0
        pos = 8
        while pos + 8 <= len(data) and inflated < expected:
            length, kind = struct.unpack_from(">I4s", data, pos)
            if kind == b"IEND":
                break
            if kind == b"IDAT":
                chunk = data[pos + 8 : pos + 8 + length]
                while chunk and inflated < expected:
                    inflated += len(inflate.decompress(chunk, _INFLATE_STEP))
                    chunk = inflate.unconsumed_tail
            pos += 12 + length
    except (struct.error, zlib.error) as exc:
        raise ImageError(f"truncated or corrupt PNG image ({exc})") from exc
    if inflated < expected:
        raise ImageError(
            f"truncated or corrupt PNG image: its pixel data ends after {inflated} of the "
            f"{expected} bytes its header declares"
        )


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
    ring: list[float] = []
    for box in ((0, 0, width, 1), (0, height - 1, width, height)):
        ring.extend(_one_band(gray.crop(box)))
    if height > 2:
        for box in ((0, 1, 1, height - 1), (width - 1, 1, width, height - 1)):
            ring.extend(_one_band(gray.crop(box)))
    return statistics.median(ring)


def _one_band(image: Image.Image) -> list[float]:
    """The pixel values of a one-band image ("L", "F"), row by row.

    Pillow types `get_flattened_data()` for every mode (a tuple per pixel when there are
    several bands); this states, and checks, that the image has one.

    Raises:
        ValueError: the image has several bands (a caller's bug, not the upload's).
    """
    values: list[float] = []
    for value in image.get_flattened_data():
        if isinstance(value, tuple):
            raise ValueError(f"expected a one-band image, got mode {image.mode}")
        values.append(value)
    return values


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
    strongest = ink.getextrema()[1]
    if isinstance(strongest, tuple):  # a (min, max) pair per band: not the "L" image promised
        raise ValueError(f"expected a one-band image, got mode {ink.mode}")
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
    values = _one_band(small)
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
