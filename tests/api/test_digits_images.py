"""`examples.digits.images`: uploaded image bytes → the UCI digits' 8×8, 0..16 grid.

Dataset digits are rendered back into big pictures (`models.digits_data.render`, dark
ink on white unless stated) and must come back as the grid they were drawn from — up
to the re-centring the preprocessing does on purpose.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from examples.digits.images import ImageError, decode_grayscale, digit_grid, png_data_bytes, preprocess_digit
from models.digits_data import encode, load_split, render
from tests.support import REPO

MAX_PIXELS = 4096 * 4096


@pytest.fixture(scope="module")
def held_out() -> tuple[np.ndarray, np.ndarray]:
    """The first 50 held-out digits [50, 8, 8] and their labels."""
    split = load_split()
    return split.test_x[:50], split.test_y[:50]


def grid_of(data: bytes, max_pixels: int = MAX_PIXELS) -> np.ndarray:
    """`preprocess_digit` as an [8, 8] array."""
    out = np.asarray(preprocess_digit(data, max_pixels=max_pixels), dtype=np.float64)
    assert out.shape == (8, 8, 1)
    return out[:, :, 0]


def centred(x: np.ndarray) -> np.ndarray:
    """What the preprocessing should make of a dataset digit, computed independently.

    Every dataset digit spans all 8 rows; its ink columns are moved to the middle.
    When the free columns are odd in number, the digit lands half a column off the
    grid, i.e. each cell is the mean of two neighbouring columns. Peak rescaled to 16.
    """
    assert (x > 0).any(axis=1).all(), "expects a digit spanning all rows"
    cols = np.flatnonzero((x > 0).any(axis=0))
    width = cols[-1] - cols[0] + 1
    crop = x[:, cols[0] : cols[-1] + 1]
    pad = (8 - width) / 2
    lo, hi = np.zeros((8, 8)), np.zeros((8, 8))
    lo[:, int(np.floor(pad)) : int(np.floor(pad)) + width] = crop
    hi[:, int(np.ceil(pad)) : int(np.ceil(pad)) + width] = crop
    expected = (lo + hi) / 2
    return expected * 16 / expected.max()


@pytest.mark.parametrize(
    ("image_format", "params"),
    [("PNG", {}), ("JPEG", {"quality": 90})],
)
def test_upscaled_dataset_digits_come_back(
    held_out: tuple[np.ndarray, np.ndarray], image_format: str, params: dict
) -> None:
    images, _ = held_out
    vs_original, vs_centred = [], []
    for x in images:
        data = encode(render(x, scale=32), image_format, **params)  # 256×256, white paper
        got = grid_of(data)
        assert got.min() >= 0.0 and got.max() == pytest.approx(16.0)
        vs_original.append(np.abs(got - x).mean())
        vs_centred.append(np.abs(got - centred(x)).mean())
    assert np.mean(vs_original) < 1.5, vs_original
    # Digits the dataset already centres come back exactly (up to 8-bit rounding) ...
    already_centred = [
        d for d, x in zip(vs_original, images, strict=True) if np.array_equal(centred(x), x * 16 / x.max())
    ]
    assert len(already_centred) >= 25 and max(already_centred) < 0.05
    # ... and every digit comes back as its centred self.
    assert max(vs_centred) < 0.05, vs_centred


def test_lossy_jpeg_at_an_odd_scale_stays_close(held_out: tuple[np.ndarray, np.ndarray]) -> None:
    # 27× puts stroke edges inside JPEG's 8×8 DCT blocks, so compression really bites.
    images, _ = held_out
    diffs = [np.abs(grid_of(encode(render(x, scale=27), "JPEG", quality=75)) - centred(x)).mean()
             for x in images]
    assert np.mean(diffs) < 0.25 and max(diffs) < 1.0, diffs


def test_dark_background_is_not_inverted(held_out: tuple[np.ndarray, np.ndarray]) -> None:
    x = held_out[0][0]
    light = grid_of(encode(render(x, light_background=True)))
    dark = grid_of(encode(render(x, light_background=False)))
    np.testing.assert_allclose(dark, light, atol=0.1)


def test_digit_anywhere_on_a_large_canvas_is_cropped_and_centred(
    held_out: tuple[np.ndarray, np.ndarray],
) -> None:
    x = held_out[0][1]
    tight = grid_of(encode(render(x, scale=20)))
    canvas = Image.new("L", (900, 500), 255)
    canvas.paste(render(x, scale=20), (37, 211))  # far off-centre, wide canvas
    np.testing.assert_allclose(grid_of(encode(canvas)), tight, atol=0.1)


def test_modes_rgb_transparent_and_16_bit(held_out: tuple[np.ndarray, np.ndarray]) -> None:
    x = held_out[0][2]
    gray = render(x)
    expected = grid_of(encode(gray))
    np.testing.assert_allclose(grid_of(encode(gray.convert("RGB"))), expected, atol=0.1)

    # Canvas export: black strokes whose opacity is the ink, on a transparent background.
    ink = Image.eval(gray, lambda v: 255 - v)
    rgba = Image.new("RGBA", gray.size, (0, 0, 0, 0))
    rgba.putalpha(ink)
    np.testing.assert_allclose(grid_of(encode(rgba)), expected, atol=0.15)

    sixteen = Image.fromarray(np.asarray(gray, dtype=np.uint16) * 257)
    assert sixteen.mode.startswith("I;16")
    np.testing.assert_allclose(grid_of(encode(sixteen)), expected, atol=0.1)


def test_exif_orientation_is_applied(held_out: tuple[np.ndarray, np.ndarray]) -> None:
    x = held_out[0][3]
    upright = render(x).convert("RGB")
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90° clockwise to display": store it turned the other way
    stored = upright.transpose(Image.Transpose.ROTATE_90)
    data = encode(stored, "JPEG", quality=95, exif=exif.tobytes())
    np.testing.assert_allclose(grid_of(data), grid_of(encode(upright, "JPEG", quality=95)), atol=0.3)


def test_thin_strokes_on_a_big_image_still_reach_16() -> None:
    image = Image.new("L", (3000, 3000), 255)
    image.paste(0, (1400, 300, 1403, 2700))  # a "1": a 3-pixel-wide vertical line
    got = grid_of(encode(image))
    assert got.max() == pytest.approx(16.0)
    # A vertical line through the middle: the same in every row, only in the centre columns.
    np.testing.assert_allclose(got, np.broadcast_to(got[0], (8, 8)))
    assert set(np.flatnonzero(got[0] > 0)) <= {3, 4}


@pytest.mark.parametrize("level", [0, 128, 255])
def test_blank_image_is_an_error(level: int) -> None:
    with pytest.raises(ImageError, match="no digit"):
        preprocess_digit(encode(Image.new("L", (64, 64), level)), max_pixels=MAX_PIXELS)


def test_faint_noise_is_not_a_digit() -> None:
    noise = np.random.default_rng(7).integers(240, 256, (64, 64), dtype=np.uint8)
    with pytest.raises(ImageError, match="no digit"):
        preprocess_digit(encode(Image.fromarray(noise)), max_pixels=MAX_PIXELS)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "not a PNG or JPEG"),
        (b"hello, this is a text file\n", "not a PNG or JPEG"),
        (encode(Image.new("L", (16, 16), 0), "GIF"), "not a PNG or JPEG"),
        (encode(Image.new("L", (16, 16), 0), "BMP"), "not a PNG or JPEG"),
    ],
)
def test_not_png_or_jpeg(data: bytes, message: str) -> None:
    with pytest.raises(ImageError, match=message):
        decode_grayscale(data, max_pixels=MAX_PIXELS)


@pytest.mark.parametrize("image_format", ["PNG", "JPEG"])
def test_truncated_image(held_out: tuple[np.ndarray, np.ndarray], image_format: str) -> None:
    data = encode(render(held_out[0][0]).convert("RGB"), image_format)
    with pytest.raises(ImageError, match="truncated or corrupt"):
        decode_grayscale(data[: len(data) // 2], max_pixels=MAX_PIXELS)


def png_of(width: int, height: int, pixel_data: bytes, *, interlaced: bool = False) -> bytes:
    """An 8-bit grayscale PNG with this header and this (filtered) pixel data, well formed."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, int(interlaced))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(pixel_data))
        + chunk(b"IEND", b"")
    )


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims width×height and whose data is a few bytes: a bomb."""
    return png_of(width, height, b"\0" * 1024)


def striped_rows(width: int, rows: int) -> bytes:
    """`rows` rows of black and white vertical stripes, each with filter type 0."""
    return b"".join(b"\0" + bytes(255 if (x // 8) % 2 else 0 for x in range(width)) for _ in range(rows))


def test_a_png_holding_fewer_rows_than_its_header_declares_is_refused() -> None:
    # A well-formed stream that ends early: Pillow alone decodes it and leaves the rest
    # black (this one was classified as a 4, p = 0.9998).
    data = png_of(4096, 4096, striped_rows(4096, 1))
    assert len(data) < 200
    with pytest.raises(ImageError, match="truncated or corrupt PNG image: its pixel data ends after 4097 of"):
        decode_grayscale(data, max_pixels=MAX_PIXELS)
    whole = png_of(64, 64, striped_rows(64, 64))
    assert decode_grayscale(whole, max_pixels=MAX_PIXELS).size == (64, 64)
    with pytest.raises(ImageError, match="truncated or corrupt PNG"):
        decode_grayscale(png_of(64, 64, striped_rows(64, 63)), max_pixels=MAX_PIXELS)


def test_an_interlaced_png_is_checked_pass_by_pass() -> None:
    # Adam7 of a 10x10 8-bit grayscale image: pass sizes (cols x rows) 2x2, 1x2, 3x1, 2x3,
    # 5x2, 5x5, 10x5, each row led by a filter byte.
    sizes = [(2, 2), (1, 2), (3, 1), (2, 3), (5, 2), (5, 5), (10, 5)]
    expected = sum(rows * (1 + cols) for cols, rows in sizes)
    assert png_data_bytes(10, 10, 8, 0, interlaced=True) == expected
    pixel_data = b"".join(b"\0" + b"\xff" * cols for cols, rows in sizes for _ in range(rows))
    assert decode_grayscale(png_of(10, 10, pixel_data, interlaced=True), max_pixels=MAX_PIXELS).size == (10, 10)
    with pytest.raises(ImageError, match="truncated or corrupt PNG"):
        decode_grayscale(png_of(10, 10, pixel_data[:-11], interlaced=True), max_pixels=MAX_PIXELS)


@pytest.mark.parametrize("mode", ["1", "L", "LA", "RGB", "RGBA", "P", "I;16"])
def test_every_png_mode_pillow_writes_passes_the_data_check(mode: str) -> None:
    data = encode(Image.new(mode, (37, 23)), "PNG")
    with pytest.raises(ImageError, match="no digit"):  # blank, but whole
        preprocess_digit(data, max_pixels=MAX_PIXELS)


@pytest.mark.parametrize(
    ("width", "height"),
    [(5000, 5000), (60_000, 60_000)],  # over our limit; also over Pillow's own bomb limit
)
def test_too_many_pixels_is_refused_from_the_header(width: int, height: int) -> None:
    data = png_header_only(width, height)
    assert len(data) < 200  # would inflate to 25 MB / 3.6 GB of pixels
    with pytest.raises(ImageError, match="pixels"):
        decode_grayscale(data, max_pixels=MAX_PIXELS)


def test_pixel_limit_is_the_setting(held_out: tuple[np.ndarray, np.ndarray]) -> None:
    data = encode(render(held_out[0][0], scale=4))  # 32×32 = 1024 pixels
    assert grid_of(data, max_pixels=1024).shape == (8, 8)
    with pytest.raises(ImageError, match="at most 1023"):
        grid_of(data, max_pixels=1023)


def test_readme_example_is_a_rendered_held_out_three() -> None:
    split = load_split()
    first_three = split.test_x[np.flatnonzero(split.test_y == 3)[0]]
    example = Image.open(REPO / "examples" / "digit-3.png")
    assert example.size == (128, 128)
    assert np.array_equal(np.asarray(example), np.asarray(render(first_three, scale=16)))


def _valid_images() -> list[bytes]:
    x = load_split().test_x[5]
    return [encode(render(x, scale=4)), encode(render(x, scale=4).convert("RGB"), "JPEG")]


VALID = _valid_images()


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(
    which=st.sampled_from(range(len(VALID))),
    cut=st.integers(min_value=0, max_value=2000),
    flips=st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 255)), max_size=8),
)
def test_mangled_bytes_give_a_grid_or_an_image_error(
    which: int, cut: int, flips: list[tuple[int, int]]
) -> None:
    data = bytearray(VALID[which][: max(1, len(VALID[which]) - cut)])
    for pos, value in flips:
        if data:
            data[pos % len(data)] = value
    try:
        grid = digit_grid(decode_grayscale(bytes(data), max_pixels=64 * 64 * 16))
    except ImageError as exc:
        assert str(exc)
        return
    values = np.asarray(grid)
    assert values.shape == (8, 8, 1)
    assert np.isfinite(values).all() and values.min() >= 0 and values.max() <= 16.0 + 1e-9

