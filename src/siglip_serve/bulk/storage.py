"""Where a bulk job's files live: local paths as they are, URIs through `pyarrow.fs`.

One filesystem object per process and S3 bucket: a decode task reads every image of its block, and a
new S3FileSystem for each would mean a new AWS client (credential chain, connection pool) per image.

S3's refusals are told as what the operator has to grant: pyarrow names the API operation that was
refused ("ACCESS_DENIED during HeadObject operation"), and an IAM policy names actions, which are not
the same words (HeadObject is authorized by s3:GetObject, ListObjectsV2 by s3:ListBucket, every step of
a multipart upload by s3:PutObject: Amazon S3 API Reference, each operation's "Permissions").
deploy/kuberay/rayjob-embed-s3-policy.json is the policy a bulk job needs.
"""

from __future__ import annotations

import errno
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow.fs as pafs

from siglip_serve.core.errors import UserError

POLICY_FILE = "deploy/kuberay/rayjob-embed-s3-policy.json"

# The IAM action that authorizes each S3 operation pyarrow's S3 filesystem sends for a bulk job.
OPERATION_ACTIONS = {
    "HeadObject": "s3:GetObject", "GetObject": "s3:GetObject",
    "ListObjectsV2": "s3:ListBucket", "ListObjects": "s3:ListBucket", "HeadBucket": "s3:ListBucket",
    "PutObject": "s3:PutObject", "CreateMultipartUpload": "s3:PutObject", "UploadPart": "s3:PutObject",
    "CompleteMultipartUpload": "s3:PutObject", "AbortMultipartUpload": "s3:AbortMultipartUpload",
    "DeleteObject": "s3:DeleteObject", "DeleteObjects": "s3:DeleteObject",
}
# Actions whose resource is the bucket itself rather than an object in it.
BUCKET_ACTIONS = frozenset({"s3:ListBucket"})

_DENIED = re.compile(r"(?:key '(?P<key>[^']*)' in )?bucket '(?P<bucket>[^']*)'.*?"
                     r"ACCESS_DENIED during (?P<operation>\w+) operation", re.DOTALL)

_filesystems: dict[str, pafs.FileSystem] = {}


class StorageDenied(UserError, PermissionError):
    """S3 refused a request: the message names the IAM action and the resource the job's role lacks."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.EACCES, message)
        self.message = message

    def __str__(self) -> str:
        return self.message


def is_uri(location: str) -> bool:
    return "://" in location


def _s3_bucket(location: str) -> str | None:
    scheme, _, rest = location.partition("://")
    # A URI with options (?region=..., ?endpoint_override=...) builds a filesystem of its own.
    if scheme.lower() != "s3" or "?" in rest or not rest.split("/", 1)[0]:
        return None
    return rest.split("/", 1)[0]


def _from_uri(location: str) -> tuple[pafs.FileSystem, str]:
    return pafs.FileSystem.from_uri(location)


def filesystem(location: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem and the path inside it: local paths as they are, URIs through pyarrow.fs, one S3
    filesystem per bucket in this process."""
    if not is_uri(location):
        return pafs.LocalFileSystem(), str(Path(location).absolute())
    bucket = _s3_bucket(location)
    if bucket is None:
        return _from_uri(location)
    path = location.partition("://")[2].rstrip("/")
    if bucket not in _filesystems:
        _filesystems[bucket] = _from_uri(location)[0]
    return _filesystems[bucket], path


def forget_filesystems() -> None:
    """Drop the cached filesystems (their credentials and endpoint were read from the environment)."""
    _filesystems.clear()


def denial(exc: OSError) -> StorageDenied | None:
    """The IAM action a refused S3 request needed, or None where `exc` is no S3 refusal."""
    found = _DENIED.search(str(exc))
    if found is None:
        return None
    operation, bucket, key = found["operation"], found["bucket"], found["key"] or ""
    action = OPERATION_ACTIONS.get(operation, f"s3:{operation}")
    resource = f"arn:aws:s3:::{bucket}" if action in BUCKET_ACTIONS else f"arn:aws:s3:::{bucket}/{key}"
    return StorageDenied(f"S3 refused {operation} on s3://{bucket}/{key}: the job's IAM role needs {action} "
                         f"on {resource} ({POLICY_FILE} is the policy a bulk job needs)")


@contextmanager
def s3_refusals_named() -> Iterator[None]:
    """Turn an S3 AccessDenied into a StorageDenied that names the missing action; other errors pass."""
    try:
        yield
    except StorageDenied:
        raise
    except OSError as exc:
        named = denial(exc)
        if named is None:
            raise
        raise named from exc
