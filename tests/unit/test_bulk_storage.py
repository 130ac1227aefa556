"""bulk/storage.py: one S3 filesystem per process and bucket, and S3's refusals named as the IAM action they need."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.fs as pafs
import pytest

from siglip_serve.bulk import stages, storage
from siglip_serve.models.preprocess import ImageLimits
from tests.helpers import jpeg_bytes


def test_a_decode_block_of_s3_images_opens_one_filesystem(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Before, every image of a block opened a filesystem of its own (64 for a block of 64); now the worker
    opens one per bucket and keeps it for its next blocks."""
    rng = np.random.default_rng(0)
    (tmp_path / "bucket" / "img").mkdir(parents=True)
    for i in range(64):
        (tmp_path / "bucket" / "img" / f"{i}.jpg").write_bytes(jpeg_bytes(rng.integers(0, 255, (8, 8, 3), np.uint8)))
    opened: list[str] = []

    def from_uri(uri: str) -> tuple[Any, str]:  # S3 stood in by a folder: bucket/key under tmp_path
        opened.append(uri)
        return pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem()), uri.removeprefix("s3://")

    monkeypatch.setattr(storage, "_from_uri", from_uri)
    storage.forget_filesystems()
    items = np.array([f"s3://bucket/img/{i}.jpg" for i in range(64)], dtype=object)
    block = {"shard": np.zeros(64, int), "pos": np.arange(64), "item": items}
    for _ in range(2):
        out = stages.decode_batch(block, size=(16, 16), limits=ImageLimits(), fast_jpeg=True, model="tiny-siglip")
        assert list(out["error_type"]) == [""] * 64
    assert opened == ["s3://bucket/img/0.jpg"]
    storage.filesystem("s3://other/x.jpg")
    storage.filesystem("s3://bucket/img/1.jpg?region=eu-west-1")  # options: a filesystem of its own
    assert opened[1:] == ["s3://other/x.jpg", "s3://bucket/img/1.jpg?region=eu-west-1"]
    storage.forget_filesystems()


@pytest.mark.parametrize(("message", "needs"), [
    ("When getting information for key 'catalogue/a.jpg' in bucket 'b': AWS Error ACCESS_DENIED during HeadObject "
     "operation: No response body.", "needs s3:GetObject on arn:aws:s3:::b/catalogue/a.jpg"),
    ("When listing objects under key 'out/' in bucket 'b': AWS Error ACCESS_DENIED during ListObjectsV2 operation: "
     "Access Denied", "needs s3:ListBucket on arn:aws:s3:::b ("),
    ("When initiating multiple part upload for key 'out/_job.json' in bucket 'b': AWS Error ACCESS_DENIED during "
     "CreateMultipartUpload operation: Access Denied", "needs s3:PutObject on arn:aws:s3:::b/out/_job.json"),
])
def test_an_s3_refusal_names_the_action_and_resource_to_grant(message: str, needs: str) -> None:
    with pytest.raises(storage.StorageDenied) as refused, storage.s3_refusals_named():
        raise OSError(message)
    assert needs in str(refused.value) and storage.POLICY_FILE in str(refused.value)
    # A decode task's row for an image it may not read carries the same sentence (bulk/stages.py, strerror).
    assert refused.value.strerror == str(refused.value) and isinstance(refused.value, PermissionError)


def test_other_errors_pass_unchanged() -> None:
    with pytest.raises(FileNotFoundError), storage.s3_refusals_named():
        raise FileNotFoundError("gone")
    with pytest.raises(OSError, match="SLOW_DOWN"), storage.s3_refusals_named():
        raise OSError("AWS Error SLOW_DOWN during GetObject operation")
