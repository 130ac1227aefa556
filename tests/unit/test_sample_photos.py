"""Unit tests for core/sample_photos.py and the corpus built from it (measure/corpus.py `sample_corpus`)."""

from __future__ import annotations

import io
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from siglip_serve.core.sample_photos import PHOTOS, photo_array, photo_jpeg
from siglip_serve.measure.corpus import sample_corpus

ROOT = Path(__file__).resolve().parents[2]
PHOTO_DIR = ROOT / "src" / "siglip_serve" / "core" / "photos"
GRAYSCALE = {"camera", "moon"}


@pytest.mark.parametrize("name", PHOTOS)
def test_each_photo_is_a_jpeg_that_decodes(name: str) -> None:
    data = photo_jpeg(name)
    with Image.open(io.BytesIO(data)) as picture:
        assert picture.format == "JPEG"
        assert picture.mode == ("L" if name in GRAYSCALE else "RGB")
    array = photo_array(name)
    assert array.dtype == np.uint8 and array.ndim == (2 if name in GRAYSCALE else 3)
    assert array.shape[:2] == picture.size[::-1] and array.flags.writeable


def test_unknown_name_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="no sample photo 'lena': choose one of astronaut, chelsea"):
        photo_jpeg("lena")


def test_the_folder_holds_the_photos_and_their_licences_and_the_wheel_ships_them() -> None:
    files = sorted(p.name for p in PHOTO_DIR.iterdir())
    assert files == sorted([*(f"{name}.jpg" for name in PHOTOS), "LICENSES.md"])
    licences = (PHOTO_DIR / "LICENSES.md").read_text()
    assert all(f"`{name}.jpg`" in licences for name in PHOTOS)
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert all(any(fnmatch(f"photos/{name}", p) for p in patterns["siglip_serve.core"]) for name in files)
    # Small enough to ship in the package (and in each device call's checkout).
    assert sum((PHOTO_DIR / name).stat().st_size for name in files) < 2 * 2**20


def test_corpus_defaults_are_the_shipped_bytes() -> None:
    corpus = sample_corpus()
    assert [image.name for image in corpus] == [f"{name}.jpg" for name in PHOTOS]
    assert [image.data for image in corpus] == [photo_jpeg(name) for name in PHOTOS]
    assert {image.content_type for image in corpus} == {"image/jpeg"}


def test_corpus_resizes_and_reencodes_when_asked() -> None:
    (resized,) = sample_corpus(["moon"], size=(64, 48))
    with Image.open(io.BytesIO(resized.data)) as picture:
        assert picture.format == "JPEG" and picture.size == (64, 48) and picture.mode == "L"
    (requality,) = sample_corpus(["chelsea"], quality=50)
    assert requality.data != photo_jpeg("chelsea") and len(requality.data) < len(photo_jpeg("chelsea"))
    with Image.open(io.BytesIO(requality.data)) as picture:
        assert picture.size == photo_array("chelsea").shape[1::-1]
