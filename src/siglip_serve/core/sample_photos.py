"""Real photographs shipped with the package (core/photos/, their sources and licences in LICENSES.md):
what the load test, the served benchmark, the trn2 check and the tests send when given no images.

Each is a JPEG (quality 90) of the full-size picture: six colour ones plus two grayscale (`camera`, `moon`),
so the server's grayscale-to-RGB path is exercised too. Core, so any package may read them; numpy and Pillow
are imported only by `photo_array`.
"""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

PHOTOS: tuple[str, ...] = ("astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field", "immunohistochemistry",
                           "camera", "moon")


def photo_jpeg(name: str) -> bytes:
    """The shipped JPEG file of the photo `name`, byte for byte."""
    if name not in PHOTOS:
        raise ValueError(f"no sample photo {name!r}: choose one of {', '.join(PHOTOS)}")
    return resources.files("siglip_serve.core").joinpath("photos", f"{name}.jpg").read_bytes()


def photo_array(name: str) -> npt.NDArray[np.uint8]:
    """The photo `name` decoded, a writable copy: (height, width, 3) for colour ones, (height, width) for
    grayscale, uint8."""
    import io

    import numpy as np
    from PIL import Image

    with Image.open(io.BytesIO(photo_jpeg(name))) as picture:
        return np.array(picture, dtype=np.uint8)
