"""Unit tests for models/preprocess.py, the contract's answer to each of its rejections (serve/http/errors.py's
table), and the base64/data-URI and Content-Type parsing of serve/http/http_body.py. All images are generated
here (Pillow/numpy) or are the package's sample photos (core/sample_photos.py)."""

from __future__ import annotations

import base64
import io
import struct
import warnings
import zlib

import numpy as np
import pytest
from PIL import Image, ImageFile, features

from siglip_serve.core import sample_photos
from siglip_serve.core.sample_photos import photo_array
from siglip_serve.models.image_errors import UnsupportedImage
from siglip_serve.models.preprocess import (
    SUPPORTED_FORMATS,
    ImageLimits,
    ImageRejected,
    decode_image,
    preprocess_image,
    resize_to_array,
)
from siglip_serve.serve.http import http_body
from siglip_serve.serve.http.errors import ApiError, rejection_error
from siglip_serve.serve.http.http_body import decode_base64_image, media_type_supported

WHITE, BLACK, RED, GREEN, BLUE = (255, 255, 255), (0, 0, 0), (255, 0, 0), (0, 255, 0), (0, 0, 255)


def encode(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def pixels(img: Image.Image) -> np.ndarray:
    assert img.mode == "RGB"
    return np.asarray(img).astype(int)


def rejected(data: bytes, limits: ImageLimits = ImageLimits()) -> ApiError:
    """The contract's answer (status, type, message) to the image error decode_image raises."""
    with pytest.raises(ImageRejected) as info:
        decode_image(data, limits)
    return rejection_error(info.value)


def row(mode: str, values: list) -> Image.Image:
    img = Image.new(mode, (len(values), 1))
    for x, v in enumerate(values):
        img.putpixel((x, 0), v)
    return img


@pytest.fixture(scope="module")
def photo_jpeg() -> bytes:
    return sample_photos.photo_jpeg("astronaut")


# --------------------------------------------------------------------------- modes


def _palette_with_transparency(fmt: str) -> bytes:
    img = Image.new("P", (3, 1))
    img.putpalette([*RED, *GREEN, *BLUE] + [0] * (253 * 3))
    img.putdata([0, 1, 2])
    return encode(img, fmt, transparency=1)  # index 1 (green) is transparent


def _tiff_i(values: list[int]) -> bytes:  # Pillow writes mode "I" as signed 32-bit
    return encode(row("I", values), "TIFF")


MODE_CASES = {
    # name: (file bytes, expected RGB pixels, tolerance)
    "RGBA fully transparent -> white, hidden colour ignored": (
        encode(row("RGBA", [(10, 200, 30, 0), (10, 200, 30, 255)]), "PNG"), [WHITE, (10, 200, 30)], 0),
    "RGBA half-transparent red on white": (
        encode(row("RGBA", [(255, 0, 0, 128), (0, 0, 255, 64)]), "PNG"), [(255, 128, 128), (191, 191, 255)], 1),
    "LA": (encode(row("LA", [(0, 0), (0, 255), (0, 128), (200, 255)]), "PNG"),
           [WHITE, BLACK, (127, 127, 127), (200, 200, 200)], 1),
    "P without transparency": (
        encode(Image.new("RGB", (2, 1), (12, 34, 56)).convert("P", palette=Image.Palette.ADAPTIVE), "PNG"),
        [(12, 34, 56)] * 2, 0),
    "P with transparency (PNG)": (_palette_with_transparency("PNG"), [RED, WHITE, BLUE], 0),
    "P with transparency (GIF)": (_palette_with_transparency("GIF"), [RED, WHITE, BLUE], 0),
    "L with tRNS": (encode(row("L", [0, 7]), "PNG", transparency=7), [BLACK, WHITE], 0),
    "RGB with tRNS": (encode(row("RGB", [(1, 2, 3), (9, 9, 9)]), "PNG", transparency=(1, 2, 3)),
                      [WHITE, (9, 9, 9)], 0),
    "1-bit": (encode(row("1", [0, 1]), "PNG"), [BLACK, WHITE], 0),
    "1-bit BMP": (encode(row("1", [1, 0]), "BMP"), [WHITE, BLACK], 0),
    "L": (encode(row("L", [0, 77, 255]), "PNG"), [BLACK, (77, 77, 77), WHITE], 0),
    "CMYK TIFF": (encode(row("CMYK", [(0, 255, 255, 0), (0, 0, 0, 255), (0, 0, 0, 0)]), "TIFF"),
                  [RED, BLACK, WHITE], 0),
    "CMYK JPEG": (encode(Image.new("CMYK", (16, 16), (255, 0, 255, 0)), "JPEG", quality=95),
                  [GREEN] * 16, 3),
    "YCbCr TIFF": (encode(Image.new("YCbCr", (2, 1), (100, 50, 200)), "TIFF"),
                   [Image.new("YCbCr", (1, 1), (100, 50, 200)).convert("RGB").getpixel((0, 0))] * 2, 0),
    # 16-bit greyscale is scaled (v / 257), not clipped at 255 as Pillow's convert does.
    "I;16 PNG scaled": (encode(row("I;16", [65535, 32768, 0, 257, 255]), "PNG"),
                        [WHITE, (128,) * 3, BLACK, (1, 1, 1), (1, 1, 1)], 0),
    "I;16 TIFF scaled": (encode(row("I;16", [65535, 32768, 0]), "TIFF"), [WHITE, (128,) * 3, BLACK], 0),
    "I;16B TIFF scaled": (encode(row("I;16B", [65535, 32768, 0]), "TIFF"), [WHITE, (128,) * 3, BLACK], 0),
    "I;16 PNG with tRNS": (encode(row("I;16", [65535, 300]), "PNG", transparency=300), [WHITE, WHITE], 0),
    "I;16 PNG dark with tRNS": (encode(row("I;16", [0, 300]), "PNG", transparency=300), [BLACK, WHITE], 0),
    # signed 32-bit: 0 stays black, positive range scales to 0..255, negatives are black
    "I (int32 TIFF) scaled": (_tiff_i([2**31 - 1, 2**30, 0, -5]), [WHITE, (128,) * 3, BLACK, BLACK], 0),
    # float: 0.0..1.0 -> 0..255, outside clipped, NaN black
    "F (float32 TIFF)": (encode(row("F", [1.0, 0.5, 0.0, 2.0, -1.0, float("nan")]), "TIFF"),
                         [WHITE, (128,) * 3, BLACK, WHITE, BLACK, BLACK], 0),
}


@pytest.mark.parametrize("name", list(MODE_CASES))
def test_modes_convert_as_seen(name: str) -> None:
    data, expected, tol = MODE_CASES[name]
    got = pixels(decode_image(data))[0]  # first row
    want = np.array(expected, dtype=int)
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= tol, (got.tolist(), want.tolist())


def test_16bit_pillow_convert_would_clip() -> None:
    # Guards the reason for our own scaling: Pillow alone turns mid-grey 16-bit white.
    img = Image.open(io.BytesIO(encode(row("I;16", [32768]), "PNG")))
    assert img.convert("RGB").getpixel((0, 0)) == WHITE
    assert decode_image(encode(row("I;16", [32768]), "PNG")).getpixel((0, 0)) == (128, 128, 128)


def _grey_tiff(values: list[int], bits: int, sample_format: int) -> bytes:
    """A minimal uncompressed 1-row greyscale TIFF with the given integer sample type."""
    code = {(16, 1): "H", (16, 2): "h", (32, 1): "I", (32, 2): "i"}[(bits, sample_format)]
    pixels_ = struct.pack(f"<{len(values)}{code}", *values)
    tags = [(256, 4, len(values)), (257, 4, 1), (258, 3, bits), (259, 3, 1), (262, 3, 1),
            (273, 4, 0), (277, 3, 1), (278, 4, 1), (279, 4, len(pixels_)), (339, 3, sample_format)]
    ifd_size = 2 + 12 * len(tags) + 4
    data_offset = 8 + ifd_size
    ifd = struct.pack("<H", len(tags))
    for tag, typ, value in tags:
        value = data_offset if tag == 273 else value
        ifd += struct.pack("<HHI", tag, typ, 1) + (struct.pack("<HH", value, 0) if typ == 3
                                                   else struct.pack("<I", value))
    return b"II*\x00" + struct.pack("<I", 8) + ifd + struct.pack("<I", 0) + pixels_


@pytest.mark.parametrize("values,bits,sample_format,expected", [
    ([0, 2**32 - 1, 2**31], 32, 1, [0, 255, 128]),  # uint32: Pillow stores it in int32
    ([0, 2**31 - 1, -7], 32, 2, [0, 255, 0]),
    ([0, 32767, 16384, -32768], 16, 2, [0, 255, 128, 0]),  # int16 -> mode "I"
    ([0, 65535, 32768], 16, 1, [0, 255, 128]),  # uint16 -> mode "I;16"
])
def test_integer_tiff_scaled_by_declared_type(values, bits, sample_format, expected) -> None:
    data = _grey_tiff(values, bits, sample_format)
    assert Image.open(io.BytesIO(data)).mode in ("I", "I;16")
    assert pixels(decode_image(data))[0, :, 0].tolist() == expected


def test_alpha_composite_matches_reference_on_random_pixels() -> None:
    rng = np.random.default_rng(0)
    rgba = rng.integers(0, 256, size=(32, 32, 4), dtype=np.uint8)
    got = pixels(decode_image(encode(Image.fromarray(rgba, "RGBA"), "PNG")))
    a = rgba[..., 3:].astype(float) / 255
    want = rgba[..., :3] * a + 255 * (1 - a)
    assert np.abs(got - want).max() <= 1.0


# --------------------------------------------------------------------------- EXIF


def _quadrant_image(w: int = 64, h: int = 32) -> Image.Image:
    arr = np.zeros((h, w, 3), np.uint8)
    arr[: h // 2, : w // 2] = RED
    arr[: h // 2, w // 2 :] = GREEN
    arr[h // 2 :, : w // 2] = BLUE
    arr[h // 2 :, w // 2 :] = WHITE
    return Image.fromarray(arr)


ORIENTATIONS = {  # EXIF orientation -> how a viewer transforms the stored pixels
    1: lambda a: a,
    2: lambda a: a[:, ::-1],
    3: lambda a: a[::-1, ::-1],
    4: lambda a: a[::-1],
    5: lambda a: a.transpose(1, 0, 2),
    6: lambda a: np.rot90(a, k=-1),
    7: lambda a: a.transpose(1, 0, 2)[::-1, ::-1],
    8: lambda a: np.rot90(a, k=1),
}


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
@pytest.mark.parametrize("orientation", sorted(ORIENTATIONS))
def test_exif_orientation_applied(fmt: str, orientation: int) -> None:
    src = _quadrant_image()
    exif = Image.Exif()
    exif[0x0112] = orientation
    kw = {"quality": 95} if fmt == "JPEG" else {"lossless": True} if fmt == "WEBP" else {}
    out = pixels(decode_image(encode(src, fmt, exif=exif, **kw)))
    want = ORIENTATIONS[orientation](np.asarray(src)).astype(int)
    assert out.shape == want.shape
    if orientation in (5, 6, 7, 8):
        assert out.shape[:2] == (64, 32)  # width and height swapped
    # compare quadrant centres (JPEG blurs edges)
    h, w = want.shape[:2]
    for y in (h // 4, 3 * h // 4):
        for x in (w // 4, 3 * w // 4):
            assert np.abs(out[y, x] - want[y, x]).max() <= 8, (y, x, out[y, x], want[y, x])


def test_orientation_6_pixel_placement() -> None:
    # Stored 64x32, red top-left; a viewer rotates 90 deg clockwise: 32x64, red at top-right.
    exif = Image.Exif()
    exif[0x0112] = 6
    img = decode_image(encode(_quadrant_image(), "JPEG", exif=exif, quality=95))
    assert img.size == (32, 64)
    px = pixels(img)
    assert np.abs(px[8, 24] - RED).max() <= 8
    assert np.abs(px[8, 8] - BLUE).max() <= 8
    assert np.abs(px[56, 24] - GREEN).max() <= 8


@pytest.mark.filterwarnings("ignore:Corrupt EXIF data")
def test_corrupt_exif_does_not_reject() -> None:
    data = encode(_quadrant_image(), "JPEG", exif=b"Exif\x00\x00II*\x00\xff\xff\xff\xff garbage")
    assert decode_image(data).size == (64, 32)


# --------------------------------------------------------------------------- formats / frames


@pytest.mark.parametrize("fmt", ["GIF", "WEBP", "PNG", "TIFF"])
def test_animated_first_frame(fmt: str) -> None:
    frames = [Image.new("RGB", (20, 10), c) for c in (RED, GREEN, BLUE)]
    data = encode(frames[0], fmt, save_all=True, append_images=frames[1:])
    assert getattr(Image.open(io.BytesIO(data)), "n_frames", 1) == 3
    out = pixels(decode_image(data))
    assert out.shape == (10, 20, 3)
    assert np.abs(out - RED).max() <= 2


def test_mpo_served_as_its_first_jpeg() -> None:
    data = encode(Image.new("RGB", (16, 16), RED), "MPO", save_all=True,
                  append_images=[Image.new("RGB", (16, 16), BLUE)])
    assert Image.open(io.BytesIO(data)).format == "MPO"
    assert np.abs(pixels(decode_image(data)) - RED).max() <= 3


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF"])
def test_supported_formats_decode_to_rgb(fmt: str) -> None:
    src = Image.fromarray(photo_array("chelsea")).resize((60, 40))
    out = decode_image(encode(src, fmt))
    assert out.mode == "RGB" and out.size == (60, 40)
    assert fmt in SUPPORTED_FORMATS
    if fmt in ("PNG", "BMP", "TIFF"):  # lossless: exactly the source pixels
        assert np.array_equal(np.asarray(out), np.asarray(src))


def test_result_is_detached_from_the_file() -> None:
    out = decode_image(encode(Image.new("RGB", (4, 4), RED), "JPEG"))
    assert type(out) is Image.Image  # plain image, no open file behind it
    assert out.getpixel((0, 0))[0] > 250


UNSUPPORTED = ["ICO", "PCX", "TGA", "PPM", "SGI", "QOI", "DDS"]
UNSUPPORTED += ["JPEG2000"] if features.check("jpg_2000") else []
UNSUPPORTED += ["AVIF"] if features.check("avif") else []


@pytest.mark.parametrize("fmt", UNSUPPORTED)
def test_identifiable_unsupported_format_is_415(fmt: str) -> None:
    err = rejected(encode(Image.new("RGB", (16, 16), RED), fmt))
    assert (err.status, err.error_type) == (415, "unsupported_media_type")
    assert f"'{fmt}'" in err.message and "JPEG" in err.message


# --------------------------------------------------------------------------- bad input


def test_empty_is_400() -> None:
    err = rejected(b"")
    assert (err.status, err.error_type) == (400, "empty_body")


@pytest.mark.parametrize("data", [
    bytes(range(256)) * 8,
    b"\x89PNG\r\n\x1a\n" + bytes(range(256)),
    b"\xff\xd8\xff\xe0" + b"\x00\x10JFIF\x00" + bytes(range(200)),
    b"\x00",
])
def test_corrupt_bytes_are_400(data: bytes) -> None:
    err = rejected(data)
    assert (err.status, err.error_type) == (400, "invalid_image")
    assert "Error" not in err.message and "Traceback" not in err.message


@pytest.mark.parametrize("fmt,kw", [("JPEG", {"quality": 90}), ("JPEG", {"progressive": True}),
                                    ("PNG", {}), ("WEBP", {}), ("GIF", {}), ("TIFF", {})])
def test_truncated_file_is_400(fmt: str, kw: dict) -> None:
    full = encode(Image.fromarray(photo_array("astronaut")), fmt, **kw)
    assert ImageFile.LOAD_TRUNCATED_IMAGES is False
    err = rejected(full[: len(full) // 2])
    assert (err.status, err.error_type) == (400, "invalid_image")
    assert err.message == "image data is truncated or corrupt"


GARBAGE = b"not the rest of an image, just printable garbage after the signature\n" * 8


@pytest.mark.parametrize("head,says", [
    (b"\xff\xd8", "JPEG"), (b"\xff\xd8\xff", "JPEG"),  # a truncated JPEG: its SOI marker, then anything
    (b"\xff\xd8\xff\xe0\x00\x10JFIF\x00", "JPEG"),
    (b"\x89PNG\r\n\x1a\n", "PNG"), (b"II*\x00", "TIFF"), (b"MM\x00*", "TIFF"),
    (b"RIFF\x00\x00\x00\x00WEBP", "WEBP"),
    # Pillow's BMP plugin takes these bytes for a header, then fails to load: its own words. (A GIF's
    # signature is followed by its sizes: garbage there declares a huge image, 413 before decoding.)
    (b"BM", None),
])
def test_a_file_that_starts_with_an_image_signature_and_does_not_decode_is_400_invalid_image(
        head: bytes, says: str | None) -> None:
    # Before: 415 "data is text, not an image" for all but BMP (the printable rest outweighed the signature).
    err = rejected(head + GARBAGE)
    assert (err.status, err.error_type) == (400, "invalid_image"), err.message
    assert err.message == (f"data starts as a {says} file but cannot be decoded (truncated or corrupt)" if says
                           else "image data is truncated or corrupt")


@pytest.mark.parametrize("data,says", [
    (b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"><rect/></svg>', "SVG"),
    (b'\xef\xbb\xbf  \n<?xml version="1.0"?><svg/>', "SVG"),
    (b"<!DOCTYPE html><html><body>\x00\x01\x02binary-ish</body></html>" + bytes(range(32)) * 8, "HTML"),
    (b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj\n<<>>\nendobj\n" + bytes(range(256)), "PDF"),
    (b"hello, this is just a text file\nwith two lines\n", "text"),
    ('{"image": "nicht b\u00f6se, nur Text"}'.encode(), "text"),
    (b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic" + bytes(range(64)), "HEIF"),
])
def test_not_an_image_is_415(data: bytes, says: str) -> None:
    err = rejected(data)
    assert says in err.message
    assert (err.status, err.error_type) == (415, "unsupported_media_type")


# --------------------------------------------------------------------------- limits


def _png_header_only(width: int, height: int, idat: bytes = b"") -> bytes:
    def chunk(tag: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit greyscale
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def _png_bomb(width: int, height: int) -> bytes:
    """A real, valid, all-black PNG: a few KB that decode to width*height bytes."""
    comp = zlib.compressobj(9)
    line = bytes(width + 1)  # filter byte + pixels
    idat = b"".join(comp.compress(line) for _ in range(height)) + comp.flush()
    return _png_header_only(width, height, idat)


@pytest.fixture
def no_decoding(monkeypatch: pytest.MonkeyPatch) -> list:
    calls: list = []
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self: calls.append(self) or None)
    return calls


def test_pixel_bomb_rejected_before_decoding(no_decoding: list) -> None:
    data = _png_bomb(8000, 8000)
    assert len(data) < 200_000
    err = rejected(data)
    assert (err.status, err.error_type) == (413, "image_too_large")
    assert err.message == "image is 8000x8000 = 64.0 megapixels, over the 40.0 megapixel limit"
    assert no_decoding == []


def test_small_limits_read_sensibly() -> None:
    err = rejected(encode(Image.new("RGB", (11, 10)), "PNG"), ImageLimits(max_pixels=100))
    assert err.message == "image is 11x10 = 0.00011 megapixels, over the 0.0001 megapixel limit"


@pytest.mark.parametrize("w,h", [(100_000, 100_000), (2**31 - 1, 2**31 - 1), (40_000_001, 1)])
def test_huge_declared_sizes_are_413_without_decoding(no_decoding: list, w: int, h: int) -> None:
    # Beyond 2x Pillow's MAX_IMAGE_PIXELS Pillow itself raises inside open(): still 413.
    err = rejected(_png_header_only(w, h))
    assert (err.status, err.error_type) == (413, "image_too_large")
    assert no_decoding == []


@pytest.mark.parametrize("w,h,ok", [(10, 10, True), (11, 10, False), (100, 1, True), (101, 1, False)])
def test_custom_pixel_limit_boundary(w: int, h: int, ok: bool) -> None:
    data = encode(Image.new("RGB", (w, h), RED), "PNG")
    limits = ImageLimits(max_pixels=100)
    if ok:
        assert decode_image(data, limits).size == (w, h)
    else:
        assert rejected(data, limits).status == 413


def test_animated_gif_checks_first_frame_size() -> None:
    frames = [Image.new("RGB", (20, 10), c) for c in (RED, GREEN)]
    data = encode(frames[0], "GIF", save_all=True, append_images=frames[1:])
    assert rejected(data, ImageLimits(max_pixels=199)).status == 413
    assert decode_image(data, ImageLimits(max_pixels=200)).size == (20, 10)


def test_body_over_max_bytes_is_413(no_decoding: list) -> None:
    data = encode(Image.new("RGB", (32, 32), RED), "PNG")
    err = rejected(data, ImageLimits(max_bytes=len(data) - 1))
    assert (err.status, err.error_type) == (413, "payload_too_large")
    assert no_decoding == []


def test_body_at_max_bytes_is_accepted() -> None:
    data = encode(Image.new("RGB", (32, 32), RED), "PNG")
    assert decode_image(data, ImageLimits(max_bytes=len(data))).size == (32, 32)


def test_pillow_global_limit_never_rejects_inside_our_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    data = encode(Image.new("RGB", (60, 60), RED), "PNG")  # 3600 px > 2 * 1000: Pillow alone would refuse
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not even a DecompressionBombWarning
        assert decode_image(data).size == (60, 60)
    assert Image.MAX_IMAGE_PIXELS == ImageLimits().max_pixels  # raised to our limit, still finite


def test_pillow_global_limit_is_never_lowered_or_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 89_478_485)
    decode_image(encode(Image.new("RGB", (4, 4)), "PNG"), ImageLimits(max_pixels=50))
    assert Image.MAX_IMAGE_PIXELS == 89_478_485
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)  # someone else disabled it: leave it so
    decode_image(encode(Image.new("RGB", (8, 8)), "PNG"))
    assert Image.MAX_IMAGE_PIXELS is None


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")  # over our limit too
def test_big_limit_above_pillow_default_rejects_with_our_message(no_decoding: list,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 89_478_485)
    limits = ImageLimits(max_pixels=300_000_000)
    err = rejected(_png_header_only(20_000, 20_000), limits)  # 400 MP: over ours, Pillow's raised to ours
    assert err.status == 413 and "400.0 megapixels" in err.message
    assert no_decoding == []


# --------------------------------------------------------------------------- base64


@pytest.fixture(scope="module")
def small_png() -> bytes:
    return encode(Image.fromarray(photo_array("coffee")).resize((40, 30)), "PNG")


def _urlsafe_sensitive_bytes() -> bytes:
    data = bytes(range(256)) * 3
    assert base64.b64encode(data) != base64.urlsafe_b64encode(data)
    return data


@pytest.mark.parametrize("make", [
    lambda b: "data:image/png;base64," + base64.b64encode(b).decode(),
    lambda b: "DATA:Image/PNG;BASE64," + base64.b64encode(b).decode(),
    lambda b: "data:image/jpeg;charset=utf-8;base64," + base64.b64encode(b).decode(),
    lambda b: "data:application/octet-stream;base64," + base64.b64encode(b).decode(),
    lambda b: "data:;base64," + base64.b64encode(b).decode(),
    lambda b: base64.b64encode(b).decode(),
    lambda b: "  \n" + base64.encodebytes(b).decode() + "\n",  # MIME-style 76-char lines
    lambda b: "data:image/png;base64,\r\n" + base64.encodebytes(b).decode().replace("\n", "\r\n"),
    lambda b: base64.urlsafe_b64encode(b).decode(),
    lambda b: base64.urlsafe_b64encode(b).decode().rstrip("="),
    lambda b: base64.b64encode(b).decode().rstrip("="),
])
@pytest.mark.parametrize("payload", ["png", "urlsafe"])
def test_base64_accepted_forms(make, payload: str, small_png: bytes) -> None:
    data = small_png if payload == "png" else _urlsafe_sensitive_bytes()
    assert decode_base64_image(make(data)) == data


def test_base64_roundtrip_to_pixels(small_png: bytes) -> None:
    data = decode_base64_image("data:image/png;base64," + base64.b64encode(small_png).decode())
    assert decode_image(data).size == (40, 30)


@pytest.mark.parametrize("item", [
    "not base64 at all!",
    "QUJD$RA==",
    "QU=JD",
    "QUJDR",  # impossible length
    "",
    "   ",
    "data:image/png;base64,",
    "data:image/png;base64",  # no comma
    "data:image/png,rawbytes",  # not base64-encoded
    "data:image/png;base64,Zm9v\u00e9YmFy",
    "data:image/png;base64,QUJD!",
])
def test_base64_invalid_is_400(item: str) -> None:
    with pytest.raises(ApiError) as info:
        decode_base64_image(item)
    assert (info.value.status, info.value.error_type) == (400, "invalid_base64")


def test_base64_non_string_is_400() -> None:
    with pytest.raises(ApiError) as info:
        decode_base64_image(b"QUJD")  # type: ignore[arg-type]
    assert info.value.status == 400


@pytest.mark.parametrize("media_type", ["image/svg+xml", "application/pdf", "text/plain", "image/x-icon",
                                        "image/heic", "video/mp4", "text/html;charset=utf-8"])
def test_base64_data_uri_unsupported_type_is_415(media_type: str, small_png: bytes) -> None:
    with pytest.raises(ApiError) as info:
        decode_base64_image(f"data:{media_type};base64," + base64.b64encode(small_png).decode())
    assert (info.value.status, info.value.error_type) == (415, "unsupported_media_type")
    assert media_type.split(";")[0] in info.value.message


def test_base64_encoded_length_over_limit_is_413_before_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*a, **k):
        raise AssertionError("decoded")
    monkeypatch.setattr(http_body.base64, "b64decode", boom)
    limits = ImageLimits(max_bytes=1000)
    with pytest.raises(ApiError) as info:
        decode_base64_image("A" * 1336, limits)  # 1336 * 3/4 = 1002 > 1000
    assert (info.value.status, info.value.error_type) == (413, "payload_too_large")


def test_base64_whitespace_does_not_count_towards_limit() -> None:
    data = bytes(range(256)) * 4  # 1024 bytes
    item = base64.encodebytes(data).decode().replace("\n", "\n\n\n")
    assert len(item) * 3 // 4 > 1024
    assert decode_base64_image(item, ImageLimits(max_bytes=1024)) == data
    with pytest.raises(ApiError) as info:
        decode_base64_image(item, ImageLimits(max_bytes=1023))
    assert info.value.status == 413


# --------------------------------------------------------------------------- resize


PHOTOS = {name: photo_array(name) for name in ("astronaut", "chelsea", "coffee", "rocket")}


@pytest.mark.parametrize("size", [(384, 384), (224, 320), (7, 3)])
def test_resize_output_layout(size: tuple[int, int]) -> None:
    out = resize_to_array(Image.fromarray(PHOTOS["coffee"]), size)
    assert out.shape == (3, *size)
    assert out.dtype == np.uint8
    assert out.flags["C_CONTIGUOUS"]


@pytest.mark.parametrize("name", sorted(PHOTOS))
@pytest.mark.parametrize("size", [(384, 384), (200, 300)])
def test_resize_bit_exact_with_torchvision(name: str, size: tuple[int, int]) -> None:
    from torchvision import transforms
    img = Image.fromarray(PHOTOS[name])
    tv = transforms.Compose([transforms.Resize(size, interpolation=transforms.InterpolationMode.BICUBIC),
                             transforms.PILToTensor()])
    want = tv(img).numpy()
    got = resize_to_array(img, size)
    assert got.shape == want.shape and np.array_equal(got, want)


@pytest.mark.parametrize("mode", ["RGB", "L"])
@pytest.mark.parametrize("size", [(384, 384), (224, 224), (200, 300), (7, 3)])
def test_fast_resize_is_pillows_within_two_levels(mode: str, size: tuple[int, int]) -> None:
    """ATen's uint8 kernel (models/fast_resize.py) against Pillow's exact bicubic: same layout, every pixel within
    two levels, and a grey image's three planes equal (the grey plane resized once)."""
    for name in sorted(PHOTOS):
        img = Image.fromarray(PHOTOS[name]).convert(mode)
        exact = resize_to_array(img, size).astype(np.int16)
        fast = resize_to_array(img, size, fast=True)
        assert fast.shape == (3, *size) and fast.dtype == np.uint8 and fast.flags["C_CONTIGUOUS"]
        assert int(np.abs(fast.astype(np.int16) - exact).max()) <= 2, (name, mode, size)
        if mode == "L":
            assert np.array_equal(fast[0], fast[1]) and np.array_equal(fast[1], fast[2])


def test_fast_jpeg_decode_resizes_fast_and_exact_stays_exact(photo_jpeg: bytes) -> None:
    exact = preprocess_image(photo_jpeg, (384, 384))
    fast = preprocess_image(photo_jpeg, (384, 384), fast_jpeg=True)
    assert np.array_equal(exact, resize_to_array(Image.open(io.BytesIO(photo_jpeg)).convert("RGB"), (384, 384)))
    assert not np.array_equal(fast, exact) and int(np.abs(fast.astype(np.int16) - exact).max()) <= 2


def test_matches_open_clip_siglip_preprocess_after_normalisation(photo_jpeg: bytes) -> None:
    # Uses open_clip's own preprocessing config for the served model (squash, bicubic, 0.5/0.5).
    import torch
    from open_clip.pretrained import get_pretrained_cfg
    from open_clip.transform import PreprocessCfg, image_transform_v2
    cfg = get_pretrained_cfg("ViT-SO400M-14-SigLIP-384", "webli")
    assert cfg["resize_mode"] == "squash" and cfg["interpolation"] == "bicubic"
    preprocess = image_transform_v2(
        PreprocessCfg(size=384, mean=cfg["mean"], std=cfg["std"], interpolation=cfg["interpolation"],
                      resize_mode=cfg["resize_mode"]),
        is_train=False,
    )
    want = preprocess(Image.open(io.BytesIO(photo_jpeg)).convert("RGB"))
    ours = torch.from_numpy(preprocess_image(photo_jpeg, (384, 384)))
    got = (ours.float().div(255) - 0.5) / 0.5
    assert torch.equal(got, want)


def test_resize_rejects_non_rgb() -> None:
    with pytest.raises(ValueError):
        resize_to_array(Image.new("RGBA", (4, 4)), (2, 2))


def test_preprocess_image_end_to_end(photo_jpeg: bytes) -> None:
    out = preprocess_image(photo_jpeg, (384, 384))
    assert out.shape == (3, 384, 384) and out.dtype == np.uint8
    with pytest.raises(ImageRejected):
        preprocess_image(b"", (384, 384))


# --------------------------------------------------------------------------- media types


@pytest.mark.parametrize("content_type,ok", [
    (None, True), ("", True),
    ("image/jpeg", True), ("image/jpg", True), ("IMAGE/JPEG", True), ("image/png", True),
    ("image/webp", True), ("image/gif", True), ("image/bmp", True), ("image/x-ms-bmp", True),
    ("image/tiff", True), ("application/octet-stream", True), ("image/png; charset=binary", True),
    (" image/png ;q=1", True),
    ("image/svg+xml", False), ("application/pdf", False), ("text/plain", False),
    ("text/html; charset=utf-8", False), ("text/csv", False), ("image/heic", False),
    ("image/x-icon", False), ("application/json", False), ("multipart/form-data; boundary=x", False),
    ("video/mp4", False), ("image/*", False), ("image", False),
])
def test_media_type_supported(content_type: str | None, ok: bool) -> None:
    assert media_type_supported(content_type) is ok


def test_rejection_carries_status_type_message() -> None:
    err = rejection_error(UnsupportedImage("nope"))
    assert (err.status, err.error_type, err.message, str(err)) == (415, "unsupported_media_type", "nope", "nope")
