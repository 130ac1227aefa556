"""`siglip-serve embed` on S3 as the RayJob has it: an S3 (moto's server on loopback, tests/s3_stand_in.py) that
refuses what the job's policy, deploy/kuberay/rayjob-embed-s3-policy.json, does not grant; inputs read from it and
shards and the summary written to it through pyarrow's S3 filesystem; a killed run resumed; and each permission
of the policy shown needed: without it the job fails, before any work, naming the action."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from siglip_serve.core.poll import poll
from tests.bounds import RUN_S, START_S, STOP_S, cluster_start
from tests.helpers import FileServer, jpeg_bytes
from tests.s3_stand_in import MotoS3, allows, read_policy, without

pytestmark = pytest.mark.own_cluster

BUCKET = "my-bucket"
# The prefixes deploy/kuberay/rayjob-embed.yaml's entrypoint names, which the policy file grants.
TABLE = "catalogue/images.parquet"
OUTPUT = f"s3://{BUCKET}/embeddings/so400m-webli"
MODEL_ARGS = ["--model", "tiny-siglip", "--set", "torch_threads=1"]


@pytest.fixture
def moto(tmp_path: Path) -> Iterator[MotoS3]:
    server = MotoS3(tmp_path, BUCKET)
    try:
        yield server
    finally:
        server.close()


def _table(items: list[str]) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.table({"path": items}), sink)
    return sink.getvalue()


def _embed(moto: MotoS3, log: Path, extra: list[str]) -> subprocess.Popen[str]:
    # A driver with a Ray of its own: the decode tasks and actors inherit this environment (the pod's
    # credentials), which the tests' shared Ray does not have.
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RAY_ADDRESS"))}, **moto.env()}
    command = [sys.executable, "-m", "siglip_serve", "embed", f"s3://{BUCKET}/{TABLE}", "--column", "path",
               "-o", OUTPUT, "--shard-size", "4", *MODEL_ARGS, *extra]
    return subprocess.Popen(command, env=env, start_new_session=True, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            text=True)


def test_the_job_runs_resumes_and_needs_each_permission_of_the_policy(moto: MotoS3, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    policy = read_policy()
    rng = np.random.default_rng(0)
    # More than a block of the input list (bulk/job.py ROWS_PER_BLOCK): the first block's shards can be
    # written while the second, which holds the URL, waits.
    images = {f"catalogue/img/{i:02d}.jpg": jpeg_bytes(rng.integers(0, 255, (24, 32, 3), dtype=np.uint8))
              for i in range(68)}
    images["catalogue/img/corrupt.jpg"] = b"\xff\xd8\xff\xe0 not really"
    with FileServer("127.0.0.2", {"/last.jpg": jpeg_bytes(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8))}) as held:
        # The last input, a URL held unanswered, keeps the first run from ending before it is killed.
        items = [*(f"s3://{BUCKET}/{k}" for k in images), f"s3://{BUCKET}/catalogue/img/gone.jpg",
                 f"{held.base}/held/last.jpg"]
        moto.setup(policy, {**images, TABLE: _table(items)})
        fs = moto.filesystem()
        root = OUTPUT.removeprefix("s3://")
        urls = ["--set", "url_fetch_allowlist=127.0.0.2/32", "--set", "url_fetch_timeout_s=180"]

        def shards() -> set[str]:
            listed = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
            return {Path(f.path).name for f in listed if Path(f.path).name.startswith("part-")}

        def first_shards() -> set[str]:
            assert first.poll() is None, (tmp_path / "first.log").read_text()
            return shards()

        mark = moto.log_mark()
        with cluster_start("the first bulk run"):  # its Ray's start, until it writes
            first = _embed(moto, tmp_path / "first.log", urls)
            try:
                _, wrote, waited = poll(first_shards, bool, START_S, interval_s=0.2)
                assert wrote, f"no shard on S3 in {waited:.0f} s"
                assert first.poll() is None, "the run ended while its last input was held"
            finally:
                os.killpg(first.pid, signal.SIGKILL)  # a crash, as a lost node ends a RayJob's driver
                first.wait(timeout=STOP_S)
        written_before = shards()
        assert 0 < len(written_before) < 18

        held.release.set()
        with cluster_start("the second bulk run"):  # a whole run: its start, its work, its stop
            second = _embed(moto, tmp_path / "second.log", urls)
            second.wait(timeout=RUN_S)
    assert second.returncode == 0, (tmp_path / "second.log").read_text()
    summary = json.loads(fs.open_input_stream(f"{root}/_summary.json").read())
    assert (summary["items"], summary["shards"], summary["shards_done_before"]) == (71, 18, len(written_before))
    assert (summary["shards_written"], summary["errors_in_output"]) == (18 - len(written_before), 2)
    # Read as a reader scoped to the prefix can: the listed files (pyarrow's dataset discovery would HEAD the
    # prefix's own name, outside `prefix/*`).
    table = pa.concat_tables(pq.read_table(f"{root}/{name}", filesystem=fs) for name in sorted(shards()))
    embedded = [i for i in items if "corrupt" not in i and "gone" not in i]
    assert sorted(table.column("path").to_pylist()) == sorted(embedded)
    listed = fs.get_file_info(pafs.FileSelector(f"{root}/_errors"))
    errors = [row for f in listed for row in pq.read_table(f.path, filesystem=fs).to_pylist()]
    assert sorted((Path(r["path"]).name, r["error_type"]) for r in errors) == [
        ("corrupt.jpg", "invalid_image"), ("gone.jpg", "unreadable")]
    assert written_before <= shards()

    # Every request both runs made is one the policy grants as AWS reads it: no directory marker, no copy,
    # no delete, nothing outside the output prefix written.
    requests = moto.requests(mark)
    assert requests and all(r.status < 400 or (r.status == 404 and r.method == "HEAD") for r in requests), requests
    for request in requests:
        action, resource = request.needs()
        assert allows(policy, action, resource), (request, action, resource)
        assert not resource.endswith("/") or action == "s3:ListBucket", request
    operations = {r.operation()[0] for r in requests}
    assert operations <= {"HeadObject", "GetObject", "ListObjectsV2", "PutObject", "CreateMultipartUpload",
                          "UploadPart", "CompleteMultipartUpload"}, operations
    assert {"HeadObject", "GetObject", "ListObjectsV2"} <= operations
    assert "PutObject" in operations or "CompleteMultipartUpload" in operations

    # Each permission removed in turn: the job stops before it starts Ray (nothing loaded, nothing embedded),
    # its error naming the action and the resource. The resume above left finished shards with errors to read.
    from siglip_serve.bulk import job as bulk_job
    from siglip_serve.bulk.storage import StorageDenied, forget_filesystems
    from siglip_serve.serve.plan.config import ServiceConfig

    for key, value in moto.env().items():
        monkeypatch.setenv(key, value)

    def no_ray(*args: object) -> bool:
        raise AssertionError("the job went on to start Ray")

    monkeypatch.setattr(bulk_job, "_start_ray", no_ray)
    spec = bulk_job.JobSpec(source=f"s3://{BUCKET}/{TABLE}", output=OUTPUT, shard_size=4)
    config = ServiceConfig(model="tiny-siglip", torch_threads=1, url_fetch_allowlist=("127.0.0.2/32",))
    forget_filesystems()
    assert bulk_job.run_job(config, spec).shards_done_before == 18  # the whole policy: nothing left to run
    removed = [(s["Sid"], a) for s in policy["Statement"] for a in ([s["Action"]] if isinstance(s["Action"], str)
                                                                    else s["Action"])]
    assert len(removed) == 4
    for sid, action in removed:
        moto.set_policy(without(policy, sid, action))
        forget_filesystems()
        with pytest.raises(StorageDenied) as refused:
            bulk_job.run_job(config, spec)
        statement = next(s for s in policy["Statement"] if s["Sid"] == sid)
        arn = statement["Resource"].removesuffix("*")
        assert f"needs {action} on {arn}" in str(refused.value), (sid, str(refused.value))
    moto.set_policy(policy)
    forget_filesystems()
