"""JPEG decode and resize on the encoder's own device: nvJPEG on a GPU, torchvision's decoder on a CPU.

On the CUDA backend the host's decode is the serving path's largest cost per image (H100 host, one
ingress: 16 ms of its 26 ms per image went to the ingress; docs/dev/benchmark-log.md). With
`device_jpeg_decode` the ingress still reads every header and checks every limit, but sends plain
8-bit JPEG files as they came; the encoder replica decodes them here, on the GPU
(`torchvision.io.decode_jpeg(device="cuda")`), resizes and hands the same uint8 [N, 3, H, W] to the
model as the host path would. EXIF orientation is applied as on the host (docs/preprocessing.md).

Same output as the host path within cosine 0.999 of the embeddings (tests/unit/test_device_decode.py,
on the tests' photos; on a GPU the `cuda`-marked test runs the nvJPEG path itself). It is not
bit-identical: the resize is torch's antialiased bicubic, not Pillow's, and no reduced-scale DCT
decode is used.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the ingress imports JpegFiles: no torch there (seconds of start-up)
    import torch


class DeviceDecodeError(ValueError):
    """A JPEG whose header passed the ingress's checks but whose data the device decoder refused."""


@dataclass(frozen=True)
class JpegFiles:
    """A chunk of one request's images sent undecoded, for `decode_resize` in the encoder replica."""

    files: tuple[bytes, ...]

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: slice) -> JpegFiles:
        return JpegFiles(self.files[index])


def decode_resize(files: Sequence[bytes], size: tuple[int, int], device: torch.device) -> torch.Tensor:
    """JPEG files -> uint8 [N, 3, H, W] on `device`: decoded as RGB with EXIF orientation applied, then
    squash-resized bicubic with antialiasing (Pillow's filter widens with the shrink the same way),
    rounded and clamped like Pillow's 8-bit result. Raises DeviceDecodeError naming the file's index."""
    import torch
    import torch.nn.functional as functional
    from torchvision.io import ImageReadMode, decode_jpeg

    out = []
    for index, data in enumerate(files):
        encoded = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        try:
            image = decode_jpeg(encoded, mode=ImageReadMode.RGB, device=device, apply_exif_orientation=True)
        except RuntimeError as exc:  # torchvision raises RuntimeError for corrupt or unsupported data
            raise DeviceDecodeError(f"file {index}: JPEG data could not be decoded") from exc
        resized = functional.interpolate(image.unsqueeze(0).float(), size=size, mode="bicubic", antialias=True,
                                         align_corners=False)
        out.append(resized.round_().clamp_(0, 255).to(torch.uint8))
    return torch.cat(out)
