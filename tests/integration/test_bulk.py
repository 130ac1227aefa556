"""`siglip-serve embed` (bulk/): the same embeddings as the service, bad inputs in the errors table,
and a killed run resumed without losing or repeating a row."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pyarrow.parquet as pq

from siglip_serve.core.poll import poll
from tests.bounds import SETTLE_S, START_S, STOP_S
from tests.helpers import API_KEY, FileServer, ServeCluster, cosine, embeddings_of, jpeg_bytes


def _read_output(folder: Path) -> dict[str, np.ndarray]:
    table = pq.read_table(folder)  # the folder as a dataset: _errors and _summary.json are skipped
    return {path: np.array(vector, dtype=np.float32)
            for path, vector in zip(table.column("path").to_pylist(), table.column("embedding").to_pylist(),
                                    strict=True)}


def _bulk_series(metrics_port: int) -> dict[str, float]:
    """The bulk-tagged samples of the service's counters on Ray's Prometheus endpoint, by name and tag."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "ray_siglip_images_embedded_total" and sample.labels.get("endpoint") == "bulk":
                found["images"] = found.get("images", 0.0) + sample.value
            if sample.name == "ray_siglip_requests_rejected_total" and sample.value:
                key = f"rejected:{sample.labels.get('reason')}"
                found[key] = found.get(key, 0.0) + sample.value
            if sample.name == "ray_siglip_encoder_forward_seconds_count" and sample.labels.get("tower") == "image":
                found["forwards"] = found.get("forwards", 0.0) + sample.value
    return found


def test_bulk_rows_equal_the_served_ones_and_bad_inputs_are_rows_of_the_errors_table(
        main_app: str, serve_cluster: ServeCluster, photo_jpegs: list[bytes], tmp_path: Path) -> None:
    from siglip_serve.bulk.job import JobSpec, run_job
    from siglip_serve.measure.load_results import BulkResult
    from siglip_serve.serve.plan.config import ServiceConfig

    photos = []
    for i, data in enumerate(photo_jpegs):
        photos.append(tmp_path / f"photo{i}.jpg")
        photos[-1].write_bytes(data)
    # cut.jpg: a truncated JPEG, its SOI marker then printable bytes (before: "data is text, not an image").
    bad = {"corrupt.jpg": b"\xff\xd8\xff\xe0 not really", "notes.txt": b"hello", "empty.png": b"",
           "cut.jpg": b"\xff\xd8\xff" + b"printable garbage after a JPEG's SOI marker\n" * 40}
    for name, data in bad.items():
        (tmp_path / name).write_bytes(data)
    listing = tmp_path / "list.txt"
    listing.write_text("\n".join([*map(str, photos), *(str(tmp_path / n) for n in bad), str(tmp_path / "gone.jpg")]))
    out = tmp_path / "out"
    config = ServiceConfig(model="tiny-siglip", torch_threads=1)

    # In the tests' Ray (main_app runs there): the job joins it rather than starting its own.
    result = run_job(config, JobSpec(source=str(listing), output=str(out), shard_size=3))

    assert (result.items, result.shards, result.embedded, result.errors) == (10, 4, 5, 5)
    assert BulkResult.read(out / "_summary.json") == result
    table = pq.read_table(out)
    assert str(table.schema.field("embedding").type) == "fixed_size_list<element: float>[64]"
    assert set(table.column("model").to_pylist()) == {"tiny-siglip"}
    assert set(table.column("weights").to_pylist()) == {"random(seed=0)"}
    rows = _read_output(out)
    assert list(rows) == [str(p) for p in photos]  # input order within and across shards
    for path, data in zip(photos, photo_jpegs, strict=True):
        served = embeddings_of(httpx.post(f"{main_app}/v1/embeddings/image", content=data, timeout=60,
                                          headers={"Content-Type": "image/jpeg", "Authorization": f"Bearer {API_KEY}"}))
        assert cosine(rows[str(path)], served[0]) >= 0.99999
    errors = {Path(r["path"]).name: (r["error_type"], r["message"])
              for r in pq.read_table(out / "_errors").to_pylist()}
    assert {name: kind for name, (kind, _) in errors.items()} == {
        "corrupt.jpg": "invalid_image", "notes.txt": "unsupported_media_type", "empty.png": "empty_body",
        "cut.jpg": "invalid_image", "gone.jpg": "unreadable"}
    assert errors["notes.txt"][1] == "data is text, not an image"  # the HTTP contract's words
    served = httpx.post(f"{main_app}/v1/embeddings/image", content=bad["cut.jpg"], timeout=60,
                        headers={"Content-Type": "image/jpeg", "Authorization": f"Bearer {API_KEY}"}).json()["error"]
    assert (served["type"], served["message"]) == ("invalid_image", f"image: {errors['cut.jpg'][1]}")

    # The service's metric names, endpoint "bulk": the Ray the job ran on exports them (1 s push here).
    # Each Ray worker pushes its own counters on its own clock: wait for every one the job's stages move.
    wanted = {"images": 5, "forwards": 1, "rejected:unreadable": 1, "rejected:empty_body": 1}
    series, counted, _ = poll(lambda: _bulk_series(serve_cluster.metrics_port),
                              lambda series: all(series.get(k, 0) >= n for k, n in wanted.items()), SETTLE_S,
                              interval_s=0.5)
    assert counted, series

    # The same job again finds every shard done and embeds nothing.
    again = run_job(config, JobSpec(source=str(listing), output=str(out), shard_size=3))
    assert (again.shards_done_before, again.shards_written, again.embedded, again.errors_in_output) == (4, 0, 0, 5)


def test_texts_in_a_table_column_equal_the_served_text_embeddings(main_app: str, tmp_path: Path) -> None:
    from siglip_serve.bulk.job import JobSpec, run_job
    from siglip_serve.serve.plan.config import ServiceConfig

    texts = ["a photo of a cat", "a rocket", "x" * 1001, "", "   "]
    (tmp_path / "texts.csv").write_text("id,text\n" + "".join(f"{i},{t}\n" for i, t in enumerate(texts)))
    out = tmp_path / "out"
    result = run_job(ServiceConfig(model="tiny-siglip", torch_threads=1),
                     JobSpec(source=str(tmp_path / "texts.csv"), output=str(out), modality="text", column="text"))
    # Before: (4, 1), the empty and the blank cell embedded although /v1/embeddings refuses them.
    assert (result.embedded, result.errors) == (2, 3)
    rows = _read_output(out)
    response = httpx.post(f"{main_app}/v1/embeddings", json={"input": texts[:2]}, timeout=60,
                          headers={"Authorization": f"Bearer {API_KEY}"})
    assert response.status_code == 200, response.text
    for text, item in zip(texts[:2], response.json()["data"], strict=True):
        assert cosine(rows[text], np.array(item["embedding"], dtype=np.float32)) >= 0.99999
    refused = pq.read_table(out / "_errors").to_pylist()
    assert [(r["path"], r["error_type"]) for r in refused] == [
        ("x" * 1001, "text_too_long"), ("", "invalid_request"), ("   ", "invalid_request")]
    for row in refused:  # the API's type and words for the same text
        answer = httpx.post(f"{main_app}/v1/embeddings", json={"input": [row["path"]], "modality": "text"}, timeout=60,
                            headers={"Authorization": f"Bearer {API_KEY}"}).json()["error"]
        assert (answer["type"], answer["message"]) == (row["error_type"], f"input[0]: {row['message']}")


def test_a_killed_run_resumes_with_every_row_once(serve_cluster, tmp_path: Path) -> None:
    """The run is killed while its last input, a URL on a server here (127.0.0.2), is held unanswered: the run
    cannot end before the kill, whatever else this machine runs, and the shards before it can be written."""
    from siglip_serve.bulk.job import JobSpec, run_job
    from siglip_serve.serve.plan.config import ServiceConfig

    rng = np.random.default_rng(0)
    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(119):
        (folder / f"{i:04d}.jpg").write_bytes(jpeg_bytes(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)))
    out = tmp_path / "out"
    import ray

    with FileServer("127.0.0.2", {"/last.jpg": jpeg_bytes(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8))}) as held:
        url = f"{held.base}/held/last.jpg"
        listing = tmp_path / "list.txt"
        listing.write_text("\n".join([*sorted(str(p) for p in folder.iterdir()), url]))
        # A driver of its own on the tests' Ray (no second Ray to start): killing it ends its actors and
        # tasks with it (Ray ends what a dead driver owned), as a crashed job would leave them.
        command = [sys.executable, "-m", "siglip_serve", "embed", str(listing), "-o", str(out),
                   "--model", "tiny-siglip", "--shard-size", "4", "--set", "torch_threads=1",
                   "--set", "url_fetch_allowlist=127.0.0.2/32", "--set", "url_fetch_timeout_s=180",
                   "--address", ray.get_runtime_context().gcs_address]
        job = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True)

        def shards() -> list[Path]:
            assert job.poll() is None, job.stderr.read() if job.stderr else ""
            return list(out.glob("part-*.parquet"))

        try:
            _, wrote, waited = poll(shards, bool, START_S, interval_s=0.05)
            assert wrote, f"no shard written in {waited:.0f} s"
            assert job.poll() is None, "the run ended while its last input was held"
        finally:
            os.killpg(job.pid, signal.SIGKILL)  # a crash: nothing gets to clean up
            job.wait(timeout=STOP_S)
        written_before = {p.name for p in out.glob("part-*.parquet")}
        assert 0 < len(written_before) < 30

        # The rerun (in the tests' Ray, to spare a second start) does only what is missing.
        held.release.set()
        rerun = run_job(ServiceConfig(model="tiny-siglip", torch_threads=1, url_fetch_allowlist=("127.0.0.2/32",)),
                        JobSpec(source=str(listing), output=str(out), shard_size=4))
    assert (rerun.shards_done_before, rerun.shards_written) == (len(written_before), 30 - len(written_before))
    paths = pq.read_table(out).column("path").to_pylist()
    assert sorted(paths) == sorted([*(str(p) for p in folder.iterdir()), url]) and len(set(paths)) == len(paths) == 120
    assert written_before <= {p.name for p in out.glob("part-*.parquet")}


def test_urls_and_repeated_files_in_a_run_on_ray(serve_cluster, photo_jpegs: list[bytes], tmp_path: Path) -> None:
    """Through Ray Data's tasks and actors: an allowed URL (a server on 127.0.0.2) is fetched and equals
    the same file read from disk, a URL to another loopback address is refused with the service's type,
    and copies of a file are answered from the run's record (traffic to 127.0.0.2/3 only)."""
    from siglip_serve.bulk.job import JobSpec, run_job
    from siglip_serve.serve.plan.config import ServiceConfig

    files = {"/b.jpg": photo_jpegs[1]}
    with FileServer("127.0.0.2", files) as allowed_server, FileServer("127.0.0.3", files) as other_server:
        (tmp_path / "a.jpg").write_bytes(photo_jpegs[0])
        (tmp_path / "b.jpg").write_bytes(photo_jpegs[1])
        copies = [tmp_path / f"a-copy{i}.jpg" for i in range(6)]
        for copy in copies:
            copy.write_bytes(photo_jpegs[0])
        allowed = f"{allowed_server.base}/b.jpg"
        refused = f"{other_server.base}/b.jpg"
        listing = tmp_path / "list.txt"
        listing.write_text("\n".join([str(tmp_path / "a.jpg"), str(tmp_path / "b.jpg"), allowed, refused,
                                      *map(str, copies)]))
        out = tmp_path / "out"
        config = ServiceConfig(model="tiny-siglip", torch_threads=1, url_fetch_allowlist=("127.0.0.2/32",))
        # Whether a copy meets the record or its first copy in the same block is the pipeline's timing;
        # either way it is answered with the first copy's embedding (tests/unit/test_bulk_repeats_and_urls.py
        # shows each path on its own).
        result = run_job(config, JobSpec(source=str(listing), output=str(out), shard_size=3))

    assert (result.items, result.embedded, result.errors) == (10, 9, 1)
    # fetched once; 127.0.0.3 never reached
    assert ([path for path, _ in allowed_server.hits], other_server.hits) == (["/b.jpg"], [])
    rows = _read_output(out)
    assert cosine(rows[allowed], rows[str(tmp_path / "b.jpg")]) >= 0.99999
    for copy in copies:
        assert cosine(rows[str(copy)], rows[str(tmp_path / "a.jpg")]) >= 0.99999
    errors = pq.read_table(out / "_errors").to_pylist()
    assert [(r["path"], r["error_type"]) for r in errors] == [(refused, "url_not_allowed")]
    assert "loopback" in errors[0]["message"]
