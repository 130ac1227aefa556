"""What an embeddings answer holds per item: the vector cut to `dimensions` (only where the operator
allows it) and written in the requested encoding (docs/http-api.md).

Encodings, for L2-normalised float32 vectors:
- float: numbers; base64: little-endian float32 bytes (both OpenAI's).
- int8: each vector scaled by 127 / max|x| and rounded, with that `scale` in the item (x ~ q / scale).
  Per vector, not one fixed range: a unit vector's components are small (|x| ~ 1/sqrt(D), 0.03 at
  SO400M's 1152 dims), so a fixed [-1, 1] range leaves most of them in a handful of levels, and a
  per-dimension range calibrated on a corpus (sentence-transformers' way) would need a calibration set
  for every checkpoint we serve. The scale cancels in cosine similarity, which is what an int8 index
  should use: cosine of two int8 vectors is the float cosine to within ~1e-3 at these dimensions.
- uint8: int8 + 128, the same scale (x ~ (q - 128) / scale).
- binary / ubinary: the sign bits (x > 0 is 1), 8 per byte, first dimension in the high bit
  (numpy.packbits), as signed (byte - 128) or unsigned bytes: Cohere's and sentence-transformers'
  layout. A length that is not a multiple of 8 is padded with 0 bits.
"""

import base64
from typing import Any

import numpy as np

from siglip_serve.serve.http.errors import ApiError, ErrorType


def check_dimensions(dimensions: int | None, full: int, allow_truncation: bool) -> int | None:
    """The length to cut to (None: keep all), or 400 before any work: fewer than the model's size only
    with truncation allowed, since SigLIP is not trained for truncation (Matryoshka)."""
    if dimensions is None or dimensions == full:
        return None
    if dimensions > full:
        raise ApiError(400, ErrorType.INVALID_REQUEST, f"dimensions {dimensions} is more than this model's {full}")
    if not allow_truncation:
        raise ApiError(400, ErrorType.INVALID_REQUEST,
                       f"dimensions {dimensions}: this model's embeddings have {full} dimensions and it was not "
                       "trained for truncation (Matryoshka), so a shorter vector loses accuracy; omit dimensions, "
                       "or ask the operator to set allow_dimension_truncation: true (lossy)")
    return dimensions


def cut_dimensions(embeddings: np.ndarray, dimensions: int) -> np.ndarray:
    """The first `dimensions` components of each row, re-normalised to unit length."""
    cut = embeddings[:, :dimensions].astype(np.float32)
    norms = np.linalg.norm(cut, axis=1, keepdims=True)
    return cut / np.maximum(norms, np.finfo(np.float32).tiny)


def encode_rows(embeddings: np.ndarray, encoding: str) -> tuple[list[Any], list[float] | None]:
    """The rows in `encoding`, and the per-row scale for int8/uint8 (None otherwise)."""
    vectors = np.ascontiguousarray(embeddings, dtype=np.float32)
    if encoding == "float":
        return list(vectors), None
    if encoding == "base64":
        return [base64.b64encode(row.astype("<f4").tobytes()).decode("ascii") for row in vectors], None
    if encoding in ("int8", "uint8"):
        peaks = np.max(np.abs(vectors), axis=1)
        scales = 127.0 / np.maximum(peaks, np.finfo(np.float32).tiny)
        quantized = np.clip(np.rint(vectors * scales[:, None]), -127, 127).astype(np.int16)
        rows = (quantized + 128).astype(np.uint8) if encoding == "uint8" else quantized.astype(np.int8)
        return list(rows), [float(s) for s in scales]
    if encoding in ("binary", "ubinary"):
        bits = np.packbits(vectors > 0, axis=1)
        return list((bits.astype(np.int16) - 128).astype(np.int8) if encoding == "binary" else bits), None
    raise ValueError(f"unknown encoding {encoding!r}")
