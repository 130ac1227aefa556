"""Bulk's decode and embed stages (bulk/stages.py) without Ray: image URLs in a list fetched under the
service's allowlist and rules (traffic to 127.0.0.2 and 127.0.0.3 only, no name resolved), and files
whose bytes the run already embedded neither decoded nor embedded again (bulk/repeats.py)."""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from siglip_serve.bulk import stages
from siglip_serve.bulk.repeats import RunRecord, digest
from siglip_serve.models.preprocess import ImageLimits
from siglip_serve.serve.plan.config import FetchSettings

SIZE = (32, 32)
DIM = 8


class Files(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, host: str, files: dict[str, bytes]) -> None:
        super().__init__((host, 0), Handler)
        self.files = files
        self.hits: list[str] = []
        self.base = f"http://{host}:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    server: Files

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.server.hits.append(self.path)
        body = self.server.files.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.send_header("Content-Length", str(len(body or b"")))
        self.end_headers()
        self.wfile.write(body or b"")


def _serve(host: str, files: dict[str, bytes]) -> Iterator[Files]:
    server = Files(host, files)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def servers(photo_jpegs: list[bytes], monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Files, Files]]:
    real = socket.getaddrinfo

    def literal_only(host, *args, **kwargs):  # type: ignore[no-untyped-def]
        ipaddress.ip_address(host.decode() if isinstance(host, bytes) else host)  # a name: ValueError, no DNS
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", literal_only)
    for allowed in _serve("127.0.0.2", {"/a.jpg": photo_jpegs[0], "/b.jpg": photo_jpegs[1]}):
        for other in _serve("127.0.0.3", {"/a.jpg": photo_jpegs[0]}):
            yield allowed, other
            assert other.hits == [], "127.0.0.3 is not allowed: nothing may reach it"


def block(items: list[str]) -> dict[str, np.ndarray]:
    n = len(items)
    return {"shard": np.zeros(n, np.int64), "pos": np.arange(n), "item": np.array(items, dtype=object)}


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every preprocess_image call's bytes."""
    seen: list[bytes] = []
    real = stages.preprocess_image

    def counting(data: bytes, *args: Any, **kwargs: Any) -> np.ndarray:
        seen.append(data)
        return real(data, *args, **kwargs)

    monkeypatch.setattr(stages, "preprocess_image", counting)
    return seen


def test_urls_in_a_list_are_fetched_under_the_allowlist_with_the_services_error_types(
        servers: tuple[Files, Files], photo_jpegs: list[bytes], tmp_path: Path, decodes: list[bytes]) -> None:
    allowed, other = servers
    local = tmp_path / "a.jpg"
    local.write_bytes(photo_jpegs[0])
    items = [f"{allowed.base}/b.jpg", f"{other.base}/a.jpg", f"{allowed.base}/redirect-nowhere", str(local),
             f"{allowed.base.replace('http', 'HTTP', 1)}/b.jpg"]
    out = stages.decode_batch(block(items), size=SIZE, limits=ImageLimits(), fast_jpeg=True, model="tiny-siglip",
                              urls=FetchSettings(allowlist=("127.0.0.2/32",)))
    assert list(out["error_type"]) == ["", "url_not_allowed", "url_fetch_failed", "", ""]
    assert "loopback" in out["message"][1] and out["message"][2] == "the server answered HTTP 404"
    expected = stages.preprocess_image(photo_jpegs[1], SIZE, ImageLimits(), True)
    assert np.array_equal(out["pixels"][0], expected) and np.array_equal(out["pixels"][4], expected)
    assert list(out["digest"][[0, 3]]) == [digest(photo_jpegs[1]), digest(photo_jpegs[0])]
    # A batch's URLs are fetched at once: the order they arrive in is not fixed.
    assert sorted(allowed.hits) == ["/b.jpg", "/b.jpg", "/redirect-nowhere"]
    # Off by default: the service's answer, naming the setting, and nothing is fetched.
    off = stages.decode_batch(block([f"{allowed.base}/b.jpg"]), size=SIZE, limits=ImageLimits(), fast_jpeg=True,
                              model="tiny-siglip")
    assert off["error_type"][0] == "url_not_allowed" and "url_fetch_allowlist is empty" in off["message"][0]
    assert len(allowed.hits) == 3


class FakeTower:
    """Embeds pixels into DIM numbers (their mean per channel, padded); counts what it is given."""

    embed_dim = DIM

    def __init__(self) -> None:
        self.given: list[int] = []

    def warmup(self, iterations: int = 1) -> None:
        pass

    def describe(self) -> dict[str, str]:
        return {"fake": "tower"}

    def encode(self, inputs: np.ndarray, on_forward: Any = None) -> np.ndarray:
        self.given.append(len(inputs))
        out = np.zeros((len(inputs), DIM), np.float32)
        out[:, :3] = inputs.reshape(len(inputs), 3, -1).mean(axis=2)
        return out


class Embedder(stages._Embedder):
    _inputs = stages.ImageEmbedActor._inputs


def test_a_file_the_run_already_embedded_is_neither_decoded_nor_embedded_again(
        photo_jpegs: list[bytes], tmp_path: Path, decodes: list[bytes]) -> None:
    paths = []
    for name, data in (("a.jpg", photo_jpegs[0]), ("a-copy.jpg", photo_jpegs[0]), ("b.jpg", photo_jpegs[1]),
                       ("c.jpg", photo_jpegs[2]), ("c-again.jpg", photo_jpegs[2])):
        paths.append(tmp_path / name)
        paths[-1].write_bytes(data)
    record = RunRecord(max_mib=1)
    earlier = np.arange(DIM, dtype=np.float32)
    record.add([digest(photo_jpegs[1])], earlier[None])  # b's bytes: embedded by an earlier block of the run
    decoded = stages.decode_batch(block([str(p) for p in paths]), size=SIZE, limits=ImageLimits(), fast_jpeg=True,
                                  model="tiny-siglip", record=record, embed_dim=DIM)
    # One decode per distinct new file: a once (not its copy), c once (not again), b never.
    assert decodes == [photo_jpegs[0], photo_jpegs[2]]
    assert list(decoded["cached"]) == [False, False, True, False, False]
    assert np.array_equal(decoded["embedding"][2], earlier)
    assert np.array_equal(decoded["pixels"][1], decoded["pixels"][0])

    tower = FakeTower()
    embedder = Embedder("image", tower, "tiny-siglip", record)  # type: ignore[arg-type]
    out = embedder(decoded)
    assert tower.given == [2]  # a and c through the model, once each
    rows = out["embedding"]
    assert np.array_equal(rows[0], rows[1]) and np.array_equal(rows[3], rows[4])
    assert not np.array_equal(rows[0], rows[3])
    assert np.array_equal(rows[2], earlier)
    # What it computed is in the record for the rest of the run: a later block skips a and c too.
    later = stages.decode_batch(block([str(paths[1]), str(paths[4])]), size=SIZE, limits=ImageLimits(),
                                fast_jpeg=True, model="tiny-siglip", record=record, embed_dim=DIM)
    assert list(later["cached"]) == [True, True] and len(decodes) == 2
    assert np.array_equal(later["embedding"][0], rows[0]) and np.array_equal(later["embedding"][1], rows[3])
    assert embedder(later)["embedding"].tolist() == later["embedding"].tolist() and tower.given == [2]


def test_without_a_record_repeats_in_one_block_are_still_decoded_and_embedded_once(
        photo_jpegs: list[bytes], tmp_path: Path, decodes: list[bytes]) -> None:
    path = tmp_path / "a.jpg"
    path.write_bytes(photo_jpegs[0])
    decoded = stages.decode_batch(block([str(path), str(path), str(tmp_path / "gone.jpg")]), size=SIZE,
                                  limits=ImageLimits(), fast_jpeg=True, model="tiny-siglip")
    assert "embedding" not in decoded and len(decodes) == 1 and list(decoded["error_type"]) == ["", "", "unreadable"]
    tower = FakeTower()
    out = Embedder("image", tower, "tiny-siglip")(decoded)  # type: ignore[arg-type]
    assert tower.given == [1] and np.array_equal(out["embedding"][0], out["embedding"][1])
    assert not out["embedding"][2].any()


def test_the_record_is_bounded_by_bytes() -> None:
    record = RunRecord(max_mib=(2 * (DIM * 4 + 400)) / (1024 * 1024))
    record.add(["00" * 32, "11" * 32, "22" * 32], np.ones((3, DIM), np.float32))
    assert [v is None for v in record.lookup(["00" * 32, "11" * 32, "22" * 32])] == [True, False, False]
    assert record.stats()["evictions"] == 1
