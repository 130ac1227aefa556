"""What a bulk job reads and writes: the list of inputs, its shards, and the output folder.

Inputs are a local folder (recursive), a list file (one path or URI a line), or a column of a
Parquet/CSV table; table files and every path in them may be URIs that `pyarrow.fs` opens
(`s3://...` where credentials exist). The list is sorted (a folder) or kept in its order (a list or
a table) and cut into shards of `shard_size` items. A shard's name carries a digest of its items and
of the job's fingerprint (model, weights, preprocessing, modality), so a rerun of the same job finds
its finished shards by name and a model change writes new ones beside the old.

A file under a shard's final name is a finished shard, and a killed run loses at most the shards it had
in flight. On a local or mounted filesystem a shard is written to a temporary name and renamed. On S3
it is uploaded under its final key at once: an object appears whole when its upload completes or not
at all (a multipart upload creates the object only on CompleteMultipartUpload), while a rename there
is a copy and a delete, and a folder an empty marker object at every level of the key, each needing
rights a job writing under one prefix does not have (bulk/storage.py; the policy it needs:
deploy/kuberay/rayjob-embed-s3-policy.json).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from siglip_serve.bulk.storage import filesystem, is_uri, s3_refusals_named
from siglip_serve.core.errors import UserError
from siglip_serve.models.preprocess import ImageLimits, check_file_size

TABLE_SUFFIXES = (".parquet", ".csv")
SHARD_PREFIX = "part-"
ERRORS_FOLDER = "_errors"
JOB_FILE = "_job.json"
# Object stores: no folders, no rename, and a single upload is atomic.
OBJECT_STORES = frozenset({"s3", "gcs"})


class InputError(UserError, ValueError):
    """The job's input cannot be listed: a missing folder or file, or a table without the column."""


def _folder_items(folder: Path) -> list[str]:
    # Hidden files and folders (.DS_Store, .git) are no one's images; everything else is tried, and
    # what is not an image goes to the errors table with the contract's reason.
    return sorted(str(p) for p in folder.rglob("*")
                  if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts))


def _list_file_items(path: Path) -> list[str]:
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def _table_column(location: str, column: str) -> list[str]:
    fs, path = filesystem(location)
    if location.lower().endswith(".parquet"):
        names = pq.read_schema(path, filesystem=fs).names
        if column not in names:
            raise InputError(f"{location} has no column {column!r}; its columns: {', '.join(names)}")
        values = pq.read_table(path, columns=[column], filesystem=fs).column(column).to_pylist()
    else:
        with fs.open_input_stream(path) as stream:
            rows = csv.DictReader(io.TextIOWrapper(io.BytesIO(stream.read()), encoding="utf-8"))
            if rows.fieldnames is None or column not in rows.fieldnames:
                raise InputError(f"{location} has no column {column!r}; its columns: "
                                 f"{', '.join(rows.fieldnames or [])}")
            values = [row[column] for row in rows]
    return ["" if v is None else str(v) for v in values]


def list_items(source: str, column: str) -> list[str]:
    """Every input of the job, in the order its output rows will have within each shard."""
    if source.lower().endswith(TABLE_SUFFIXES):
        if not is_uri(source) and not Path(source).is_file():
            raise InputError(f"input table not found: {source}")
        with s3_refusals_named():
            return _table_column(source, column)
    if is_uri(source):
        raise InputError(f"a URI input must be a .parquet or .csv table of paths, got {source}")
    path = Path(source)
    if path.is_dir():
        return _folder_items(path)
    if path.is_file():
        return _list_file_items(path)
    raise InputError(f"input not found: {source} (a folder, a list file, or a .parquet/.csv table)")


def read_bytes(location: str, limits: ImageLimits) -> bytes:
    """A file's bytes; a file over the byte limit is refused by its size before anything is read (on S3
    the size comes from the HEAD that opening the file sends: one HEAD and one GET per image)."""
    fs, path = filesystem(location)
    with s3_refusals_named(), fs.open_input_file(path) as handle:
        check_file_size(handle.size(), limits)
        return bytes(handle.read())


@dataclass(frozen=True)
class Shard:
    index: int
    items: tuple[str, ...]
    name: str


def plan_shards(items: Sequence[str], shard_size: int, fingerprint: str) -> list[Shard]:
    if shard_size < 1:
        raise InputError(f"shard size must be at least 1, got {shard_size}")
    shards = []
    for index, start in enumerate(range(0, len(items), shard_size)):
        chunk = tuple(items[start:start + shard_size])
        digest = hashlib.sha256("\0".join((fingerprint, *chunk)).encode()).hexdigest()[:12]
        shards.append(Shard(index, chunk, f"{SHARD_PREFIX}{index:06d}-{digest}"))
    return shards


class OutputFolder:
    """The job's output: `part-*.parquet` (finished shards), `_errors/part-*.parquet`, `_summary.json`,
    and `_job.json` (what the last run to start here was: its fingerprint and shards).

    pyarrow reads the folder as one table of embeddings (it skips names starting with _ or .);
    DuckDB and LanceDB read `OUT/part-*.parquet`. Every S3 request it makes is one of those the job's
    policy grants: list the bucket, read and write objects under the output prefix.
    """

    def __init__(self, location: str) -> None:
        self.location = location
        self.fs, self.root = filesystem(location)
        self.object_store = self.fs.type_name in OBJECT_STORES
        if not self.object_store:
            self.fs.create_dir(self.root, recursive=True)

    def _path(self, *parts: str) -> str:
        return "/".join((self.root.rstrip("/"), *parts))

    def _parquet_names(self, folder: str) -> set[str]:
        with s3_refusals_named():
            listed = self.fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
        return {Path(f.path).name.removesuffix(".parquet") for f in listed
                if f.type == pafs.FileType.File and Path(f.path).name.startswith(SHARD_PREFIX)
                and f.path.endswith(".parquet")}

    def finished(self) -> set[str]:
        """Names of the shards whose output file is in place."""
        return self._parquet_names(self.root)

    def start(self, job: dict[str, object], names: Iterable[str]) -> tuple[set[str], int]:
        """Before any work: write `_job.json` (a job that may not write here fails now, not after its
        encoders have loaded), then the finished shards among `names` and their errors' row count."""
        self.write_text(JOB_FILE, json.dumps(job, indent=2) + "\n")
        finished = self.finished() & set(names)
        return finished, self.read_errors(finished)

    def write(self, table: pa.Table, name: str, folder: str | None = None) -> str:
        """Only a whole file ever has the final name: renamed from a temporary one where files are, one
        upload of the encoded bytes on an object store."""
        parts = (folder,) if folder else ()
        final = self._path(*parts, f"{name}.parquet")
        if self.object_store:
            sink = pa.BufferOutputStream()  # encoded whole first: an encoding error uploads nothing
            pq.write_table(table, sink)
            with s3_refusals_named(), self.fs.open_output_stream(final) as stream:
                stream.write(sink.getvalue())
            return final
        if folder:
            self.fs.create_dir(self._path(folder), recursive=True)
        temporary = self._path(*parts, f".{name}.{uuid.uuid4().hex}.tmp")
        pq.write_table(table, temporary, filesystem=self.fs)
        self.fs.move(temporary, final)
        return final

    def write_text(self, name: str, text: str) -> str:
        path = self._path(name)
        with s3_refusals_named(), self.fs.open_output_stream(path) as stream:
            stream.write(text.encode())
        return path

    def read_errors(self, names: Iterable[str]) -> int:
        """Rows in the errors tables of these shards (a finished shard's errors, for the summary)."""
        wanted = set(names)
        if not wanted:
            return 0
        present = self._parquet_names(self._path(ERRORS_FOLDER)) & wanted
        with s3_refusals_named():
            return sum(pq.read_metadata(self._path(ERRORS_FOLDER, f"{name}.parquet"), filesystem=self.fs).num_rows
                       for name in present)
