"""Image decoding, validation and preprocessing for the SigLIP image encoder.

Turns untrusted image file bytes into the uint8 ``[3, H, W]`` array the model expects.
Everything that can go wrong with an image is raised as one of the ``ImageRejected`` subclasses of
models/image_errors.py; see docs/preprocessing.md.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from siglip_serve.models.image_errors import (
    CorruptImage,
    EmptyImage,
    ImageFileTooLarge,
    ImageRejected,
    ImageTooLarge,
    UnsupportedImage,
)

__all__ = [
    "ImageRejected",
    "check_file_size",
    "ImageLimits",
    "ImageHeader",
    "probe_image",
    "SUPPORTED_FORMATS",
    "SIGNATURE_BYTES",
    "signature_format",
    "decode_image",
    "resize_to_array",
    "preprocess_image",
]


@dataclass(frozen=True)
class ImageLimits:
    max_bytes: int = 20 * 1024 * 1024
    max_pixels: int = 40_000_000
    # Longest side, from the header. Bounds the extreme shapes (1 x 39,000,000) whose resample
    # tables alone cost gigabytes; 16384 is also WebP's and most GPUs' texture limit.
    max_side: int = 16384


@dataclass(frozen=True)
class ImageHeader:
    """What the header says, before any pixel is decoded."""

    width: int
    height: int
    mode: str
    format: str

    @property
    def pixels(self) -> int:
        return self.width * self.height

    @property
    def decode_bytes(self) -> int:
        """Peak bytes a decode of this image holds: the decoded frame plus its 8-bit copy on the way to RGB."""
        return self.pixels * (_storage_bytes(self.mode) + 4)


def _storage_bytes(mode: str) -> int:
    # Pillow keeps 1-band 8-bit modes in one byte per pixel, 16-bit in two, every other mode in four.
    if mode in ("1", "L", "P"):
        return 1
    if mode.startswith("I;16"):
        return 2
    return 4


# MPO is how Pillow names JPEGs carrying extra (e.g. depth/stereo) frames; frame 0 is
# the ordinary JPEG picture, so it is served like one.
SUPPORTED_FORMATS: frozenset[str] = frozenset({"JPEG", "MPO", "PNG", "WEBP", "GIF", "BMP", "TIFF"})
_FORMATS_TEXT = "JPEG, PNG, WEBP, GIF, BMP, TIFF"

# The first bytes by which Pillow 13 recognises each format of SUPPORTED_FORMATS (each plugin's `_accept`:
# PIL/JpegImagePlugin.py, PngImagePlugin.py, GifImagePlugin.py, BmpImagePlugin.py, TiffImagePlugin.py's
# PREFIXES, WebPImagePlugin.py's RIFF....WEBP); MPO is a JPEG to them. A JPEG by its SOI marker alone
# (Pillow also wants the next marker's FF): a file cut or garbled right after it is still a broken JPEG,
# and no UTF-8 text starts with FF.
_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"\xff\xd8", "JPEG"), (b"\x89PNG\r\n\x1a\n", "PNG"), (b"GIF87a", "GIF"), (b"GIF89a", "GIF"),
    (b"BM", "BMP"), (b"MM\x00\x2a", "TIFF"), (b"II\x2a\x00", "TIFF"), (b"MM\x2a\x00", "TIFF"),
    (b"II\x00\x2a", "TIFF"), (b"MM\x00\x2b", "TIFF"), (b"II\x2b\x00", "TIFF"),
)
# Enough of a file's start to tell every signature above (WebP's ends at byte 12).
SIGNATURE_BYTES = 12


def signature_format(head: bytes) -> str | None:
    """The supported format whose signature `head` (a file's first SIGNATURE_BYTES or more) starts with."""
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    return next((name for signature, name in _SIGNATURES if head.startswith(signature)), None)

_WHITE = (255, 255, 255)


def _mp(pixels: int) -> str:
    megapixels = pixels / 1e6
    return f"{megapixels:.1f}" if megapixels >= 0.1 else f"{megapixels:.2g}"


def _invalid(message: str = "image data is truncated or corrupt") -> CorruptImage:
    return CorruptImage(message)


def _too_many_pixels(limits: ImageLimits, width: int | None = None, height: int | None = None) -> ImageTooLarge:
    if width is None or height is None:
        what = "image dimensions are"
    else:
        what = f"image is {width}x{height} = {_mp(width * height)} megapixels,"
    return ImageTooLarge(f"{what} over the {_mp(limits.max_pixels)} megapixel limit")


def _side_too_long(limits: ImageLimits, width: int, height: int) -> ImageTooLarge:
    return ImageTooLarge(f"image is {width}x{height}, over the {limits.max_side}-pixel side length limit")


def check_file_size(size: int, limits: ImageLimits) -> None:
    """Raises ImageFileTooLarge when an image file of `size` bytes is over the byte limit."""
    if size > limits.max_bytes:
        raise ImageFileTooLarge(f"image is {size} bytes, over the {limits.max_bytes} byte limit")


def _let_pillow_open_up_to(max_pixels: int) -> None:
    # Pillow warns above MAX_IMAGE_PIXELS and raises above twice that, inside
    # Image.open and before we see the size. Our own check (before load) is the one that
    # matters, so Pillow's global must never be *stricter* than our limit. We only ever
    # raise it, and only to our own finite limit: it stays a real guard for any other
    # code in the process, and is never lowered under a caller that configured more.
    current = Image.MAX_IMAGE_PIXELS
    if current is not None and max_pixels > current:
        Image.MAX_IMAGE_PIXELS = max_pixels


def _rejection_for_unidentified(data: bytes) -> ImageRejected:
    """Pillow found no image format: tell 'not an image at all' from garbage, and a file that starts as
    one of ours (a truncated JPEG: its SOI marker, then anything) from both: that is a broken image."""
    started_as = signature_format(data)
    if started_as is not None:
        return _invalid(f"data starts as a {started_as} file but cannot be decoded (truncated or corrupt)")
    head = data[:4096]
    start = head.lstrip(b"\xef\xbb\xbf \t\r\n\x0b\x0c")
    if start.startswith(b"<"):
        return UnsupportedImage("data looks like SVG, XML or HTML, not a supported image")
    if b"%PDF-" in head[:1024]:  # PDF allows junk before the header
        return UnsupportedImage("data is a PDF document, not an image")
    if head[4:8] == b"ftyp":  # ISO-BMFF: HEIC/HEIF (what iPhones send), MP4, ...
        return UnsupportedImage(f"unsupported image format (HEIF/ISO media); supported: {_FORMATS_TEXT}")
    text = head.decode("utf-8", errors="replace")
    # U+FFFD (undecodable byte) counts as printable to str.isprintable, so exclude it.
    printable = sum(1 for c in text if c != "\ufffd" and (c.isprintable() or c in "\t\n\r"))
    if text and printable >= 0.9 * len(text):
        return UnsupportedImage("data is text, not an image")
    return _invalid("data is not a recognisable image (corrupt or unknown format)")


def _tiff_integer_range(img: Image.Image) -> tuple[int, bool]:
    """(bits per sample, signed) of a mode "I" image. Only TIFF produces "I" among our formats."""
    tags = getattr(img, "tag_v2", None)
    if tags is None:
        return 32, True  # Pillow's own meaning of mode "I": signed 32-bit

    def first(tag: int, default: int) -> int:
        value = tags.get(tag)
        if isinstance(value, tuple):
            value = value[0] if value else None
        return default if value is None else int(value)

    # TIFF defaults: SampleFormat 1 = unsigned integer; 2 = signed.
    return first(258, 32), first(339, 1) == 2


# Rows converted at a time for 32-bit and float images: the int64/float64 temporaries stay a few
# MB instead of 8 bytes per pixel of the whole image.
_CHUNK_PIXELS = 1 << 20
# round(v / 257) for every 16-bit value: one table lookup per pixel, no wide temporaries.
_LUT_16_TO_8 = ((np.arange(65536, dtype=np.uint32) * 255 + 32767) // 65535).astype(np.uint8)


def _scale_rows(raw: np.ndarray, to_uint8: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    grey = np.empty(raw.shape, dtype=np.uint8)
    rows = max(1, _CHUNK_PIXELS // max(raw.shape[1], 1))
    for start in range(0, raw.shape[0], rows):
        grey[start: start + rows] = to_uint8(raw[start: start + rows])
    return grey


def _high_depth_to_l(img: Image.Image) -> Image.Image:
    """16/32-bit integer or float greyscale -> 8-bit "L" (or "LA"), scaled over the type's range.

    Pillow's own convert("L") clips at 255, which turns almost any 16-bit photo white.
    """
    raw = np.asarray(img)
    if img.mode == "F":
        # Float images have no type range; [0.0, 1.0] is the universal convention.
        def float_to_uint8(part: np.ndarray) -> np.ndarray:
            values = np.nan_to_num(part.astype(np.float64), nan=0.0, posinf=1.0, neginf=0.0)
            return np.rint(np.clip(values, 0.0, 1.0) * 255.0).astype(np.uint8)

        grey = _scale_rows(raw, float_to_uint8)
    elif img.mode.startswith("I;16"):
        grey = _LUT_16_TO_8[raw]  # np.asarray already gives native-order uint16
    else:
        bits, signed = _tiff_integer_range(img)
        bits = min(max(bits, 1), 32)
        if not signed and bits == 32:
            raw = raw.view(np.uint32)  # Pillow stores uint32 in int32 storage
        # Signed data is almost always non-negative intensities written by a tool
        # that happened to pick a signed type: keep 0 black and scale by the
        # positive range rather than turning 0 into mid-grey.
        top = (1 << (bits - 1 if signed else bits)) - 1

        def int_to_uint8(part: np.ndarray) -> np.ndarray:
            return ((np.clip(part.astype(np.int64), 0, top) * 255 + top // 2) // top).astype(np.uint8)

        grey = _scale_rows(raw, int_to_uint8)
    out = Image.fromarray(np.ascontiguousarray(grey))
    del grey
    transparent = img.info.get("transparency")
    if isinstance(transparent, int) and not isinstance(transparent, bool):
        alpha = Image.fromarray(np.where(raw == transparent, 0, 255).astype(np.uint8))
        out = Image.merge("LA", (out, alpha))
    return out


def _to_rgb(img: Image.Image, keep_grey: bool = False) -> Image.Image:
    """Any decoded mode -> a new "RGB" image, as a person viewing the file would see it.

    With `keep_grey`, an opaque greyscale image stays "L": resizing it before the RGB conversion
    gives the same pixels (bicubic works per band) for a quarter of the memory.
    """
    if img.mode in ("I", "F") or img.mode.startswith("I;16"):
        img = _high_depth_to_l(img)
    try:
        if img.has_transparency_data:
            # Alpha-weighted composite on white: what a viewer on a white page shows,
            # instead of convert("RGB") exposing the colour hidden under transparent pixels.
            rgba = img.convert("RGBA")
            out = Image.new("RGB", rgba.size, _WHITE)
            out.paste(rgba, (0, 0), rgba)
            return out
        if keep_grey and img.mode in ("L", "1"):
            return img.convert("L") if img.mode == "1" else img.copy()
        return img.convert("RGB")
    except ValueError:  # a mode Pillow cannot convert (none of our decoders should yield one)
        raise UnsupportedImage(f"unsupported pixel mode '{img.mode}'") from None


def _open(data: bytes, limits: ImageLimits) -> Image.Image:
    """The lazily opened image (header read, no pixel decoded), every header-level limit checked."""
    if not data:
        raise EmptyImage("image data is empty")
    check_file_size(len(data), limits)
    _let_pillow_open_up_to(limits.max_pixels)
    try:
        img = Image.open(io.BytesIO(data))  # lazy: reads the header only
    except UnidentifiedImageError:
        raise _rejection_for_unidentified(data) from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        # Pillow refused the declared size before telling us what it is; over our limit either way.
        raise _too_many_pixels(limits) from None
    except MemoryError:
        raise
    except Exception:  # a plugin choked on a malformed header
        raise _invalid() from None
    try:
        if img.format not in SUPPORTED_FORMATS:
            raise UnsupportedImage(f"unsupported image format '{img.format}'; supported: {_FORMATS_TEXT}")
        # img.size is the first frame's (GIF: logical screen) size, from the header.
        width, height = img.size
        if width <= 0 or height <= 0:
            raise _invalid(f"image has no pixels ({width}x{height})")
        if width * height > limits.max_pixels:
            raise _too_many_pixels(limits, width, height)
        if max(width, height) > limits.max_side:
            raise _side_too_long(limits, width, height)
    except BaseException:
        img.close()
        raise
    return img


def probe_image(data: bytes, limits: ImageLimits = ImageLimits()) -> ImageHeader:
    """The header's size and mode, every header-level limit checked; no pixel decoded. Raises ImageRejected."""
    with _open(data, limits) as img:
        return ImageHeader(img.size[0], img.size[1], img.mode, str(img.format))


def _decode(data: bytes, limits: ImageLimits, draft_size: tuple[int, int] | None, keep_grey: bool) -> Image.Image:
    with _open(data, limits) as img:
        if draft_size is not None and img.format in ("JPEG", "MPO"):
            img.draft(None, draft_size)  # None: keep the file's mode (CMYK stays CMYK)
        try:
            img.load()  # decodes the current frame, which after open is the first one
        except MemoryError:
            raise
        except Exception:  # truncated/corrupt data; LOAD_TRUNCATED_IMAGES stays off
            raise _invalid() from None
        try:
            ImageOps.exif_transpose(img, in_place=True)
        except Exception:
            pass  # unreadable EXIF: show the pixels as stored, like most viewers do
        return _to_rgb(img, keep_grey)


def decode_image(data: bytes, limits: ImageLimits = ImageLimits(),
                 draft_size: tuple[int, int] | None = None) -> Image.Image:
    """bytes -> RGB PIL image (EXIF applied, first frame, alpha on white, 16-bit scaled). Raises ImageRejected.

    With `draft_size` (W, H), a JPEG is decoded at the smallest 1/2, 1/4 or 1/8 DCT scale that is
    still at least that large; other formats are decoded whole.
    """
    return _decode(data, limits, draft_size, keep_grey=False)


# Past this much shrinking on an axis, a box reduce() first brings the image down to DRAFT_MARGIN x
# the target, then bicubic finishes: the resampler's work and coefficient tables grow with the
# shrink factor. 128x: only extreme shapes (a 16384-px side to a 64-px model); every photo to a
# 224/384 model, even a 12 MP one, keeps open_clip's exact bicubic pixels.
REDUCE_ABOVE = 128


def _reduce_factors(src: tuple[int, int], dst: tuple[int, int]) -> tuple[int, int]:
    return tuple(  # type: ignore[return-value]
        max(1, s // (DRAFT_MARGIN * d)) if s > REDUCE_ABOVE * d else 1 for s, d in zip(src, dst, strict=True)
    )


def resize_to_array(img: Image.Image, size: tuple[int, int], fast: bool = False,
                    resample: str = "bicubic") -> np.ndarray:
    """RGB (or opaque "L") image -> uint8 [3, H, W], squash resize to size=(H, W) with Pillow's `resample` filter
    (SigLIP's bicubic unless the model's processor names another); `fast` (bicubic only): on ATen's vectorised
    kernel, within a level or two of Pillow's pixels (models/fast_resize.py)."""
    if img.mode not in ("RGB", "L"):
        raise ValueError(f"resize_to_array expects an RGB or L image, got mode {img.mode!r}")
    height, width = size
    factors = _reduce_factors(img.size, (width, height))
    if factors != (1, 1):
        img = img.reduce(factors)
    if fast and resample == "bicubic":
        from siglip_serve.models.fast_resize import resize_uint8

        return resize_uint8(img, height, width)
    # Exactly what torchvision's Resize((H, W), BICUBIC) does to a PIL image, so the
    # result matches open_clip's preprocessing bit for bit (before normalisation), for every
    # image that needs no reduce() first (REDUCE_ABOVE); with another filter, what transformers' PIL
    # image processor does (Image.resize with no reducing_gap).
    resized = img.resize((width, height), Image.Resampling[resample.upper()])
    if resized.mode == "L":
        resized = resized.convert("RGB")  # per-band resampling: the same pixels as resizing RGB
    return np.ascontiguousarray(np.asarray(resized, dtype=np.uint8).transpose(2, 0, 1))


# Named in every bulk output row (bulk/job.py): change it whenever a pixel of the output can change, so
# `siglip-serve embed` re-embeds rather than mixing old and new rows under one name.
PREPROCESS_VERSION = "squash-bicubic-uint8-v1"
# What the fast path (`fast_jpeg_decode`) adds to it: the reduced-scale JPEG decode and ATen's resize.
FAST_PREPROCESS = "+jpeg-draft+aten-resize"

# A JPEG much larger than the model's input is decoded at a reduced DCT scale that still leaves at
# least this factor of pixels over the target, then bicubic-resized: 5-10x less decode work for
# phone photos, within cosine 0.99997 of a full decode (docs/preprocessing.md).
DRAFT_MARGIN = 2


def preprocess_image(data: bytes, size: tuple[int, int], limits: ImageLimits = ImageLimits(),
                     fast_jpeg: bool = False, resample: str = "bicubic") -> np.ndarray:
    """decode + resize_to_array. `fast_jpeg` allows a reduced-scale JPEG decode (see DRAFT_MARGIN) and resizes on
    ATen's kernel (models/fast_resize.py) where the filter is bicubic."""
    draft = None
    if fast_jpeg:
        # Square and on the longer side: the draft happens before EXIF rotation.
        side = DRAFT_MARGIN * max(size)
        draft = (side, side)
    return resize_to_array(_decode(data, limits, draft, keep_grey=True), size, fast=fast_jpeg, resample=resample)
