"""Why an input image cannot be used: one exception class per thing its sender has to do differently.

Raised by models/preprocess.py. They know no transport: whoever serves images decides what each
means to its clients (serve/http/errors.py holds the service's table). A message is plain words for the
image's sender, naming the limit where one was crossed, and never an internal exception's text.
"""

from __future__ import annotations

from siglip_serve.core.errors import Rejected

__all__ = [
    "ImageRejected",
    "EmptyImage",
    "CorruptImage",
    "UnsupportedImage",
    "ImageTooLarge",
    "ImageFileTooLarge",
]


class ImageRejected(Rejected):
    """Base of every image rejection; raise one of the subclasses."""


class EmptyImage(ImageRejected):
    """No data at all."""


class CorruptImage(ImageRejected):
    """Data in no recognisable format, or a known format that is truncated, corrupt or has no pixels."""


class UnsupportedImage(ImageRejected):
    """A format or pixel mode this service does not read, or data that is no image (SVG, PDF, text)."""


class ImageTooLarge(ImageRejected):
    """The header declares more pixels, or a longer side, than the limits allow; nothing was decoded."""


class ImageFileTooLarge(ImageRejected):
    """The file's bytes are over the byte limit."""
