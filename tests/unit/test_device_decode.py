"""JPEG decode on the encoder's device (models/device_decode.py) gives what the host path gives: here on
the CPU device (torchvision's decoder, the same code), on a GPU with nvJPEG in the cuda-marked test."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from siglip_serve.models.device_decode import DeviceDecodeError, decode_resize
from siglip_serve.models.preprocess import preprocess_image
from tests.helpers import TinyReference, cosine


def host_and_device(photo_jpegs: list[bytes], tiny_reference: TinyReference, device: str) -> list[float]:
    size = tiny_reference.image_size
    on_device = decode_resize(photo_jpegs, size, torch.device(device)).cpu()
    scores = []
    for data, pixels in zip(photo_jpegs, on_device, strict=True):
        host = preprocess_image(data, size)
        assert pixels.shape == (3, *size) and pixels.dtype == torch.uint8
        assert np.abs(pixels.numpy().astype(int) - host.astype(int)).mean() < 3.0  # of 255
        with torch.inference_mode():
            scores.append(cosine(tiny_reference.embedder(pixels[None]).numpy()[0], tiny_reference.embed(data)))
    return scores


def test_device_decode_on_the_cpu_device_matches_the_host_path(photo_jpegs: list[bytes],
                                                               tiny_reference: TinyReference) -> None:
    assert min(host_and_device(photo_jpegs, tiny_reference, "cpu")) >= 0.999


@pytest.mark.cuda
def test_nvjpeg_decode_matches_the_host_path(photo_jpegs: list[bytes], tiny_reference: TinyReference) -> None:
    assert min(host_and_device(photo_jpegs, tiny_reference, "cuda")) >= 0.999


def test_exif_orientation_is_applied_as_on_the_host(tiny_reference: TinyReference) -> None:
    picture = Image.new("RGB", (96, 48), (255, 0, 0))
    picture.paste((0, 0, 255), (0, 0, 48, 48))  # left half blue
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to view: the blue half ends up on top
    buffer = io.BytesIO()
    picture.save(buffer, "JPEG", quality=95, exif=exif)
    data = buffer.getvalue()
    device = decode_resize([data], (64, 64), torch.device("cpu"))[0].numpy().astype(int)
    host = preprocess_image(data, (64, 64)).astype(int)
    assert np.abs(device - host).mean() < 3.0
    assert device[2, :16].mean() > 200 and device[0, -16:].mean() > 200  # blue on top, red below


def test_corrupt_data_is_refused_naming_the_file() -> None:
    with pytest.raises(DeviceDecodeError, match="file 0"):
        decode_resize([b"\xff\xd8\xff\xe0 not a jpeg"], (64, 64), torch.device("cpu"))
