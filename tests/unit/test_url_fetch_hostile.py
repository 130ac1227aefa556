"""Images by URL against an origin that means harm (serve/ingress/url_fetch.py): compression bombs, cookies, answers
that are not what HTTP promises, and a client that queues hundreds of slow URLs.

The origin is a socket server on 127.0.0.2 that writes whatever bytes a test asks for; nothing goes anywhere
else and no name is looked up (names resolve through a stub resolver to 127.0.0.2). Each answer is checked
where a client meets it: the contract's status and type from fetch_url_items (what the API answers), on
plain asyncio and on uvloop, and the row of bulk's errors table (bulk/stages.py, under plain asyncio).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import brotli
import numpy as np
import pytest
import uvloop

from siglip_serve.bulk import stages
from siglip_serve.models.preprocess import ImageLimits
from siglip_serve.serve.http.embed_request import image_item
from siglip_serve.serve.http.errors import ApiError
from siglip_serve.serve.ingress.url_fetch import UrlFetcher, fetch_url_items
from siglip_serve.serve.plan.config import FetchSettings

IMAGE = b"\x89PNG not really" * 100
GIB = 1024
HOLD_S = 30.0  # longer than the test runs


def zero_bomb(coding: str, mib: int) -> bytes:
    """`mib` MiB of zeros in `coding`, built a MiB at a time (never held whole)."""
    zeros = bytes(1 << 20)
    if coding == "br":
        compressor = brotli.Compressor(quality=5)
        return b"".join([compressor.process(zeros) for _ in range(mib)] + [compressor.finish()])
    if coding == "zstd":  # Python 3.11 has no zstd module: a frame of RLE blocks (RFC 8878 3.1.1.2), by hand
        block = (1 << 1) | ((128 << 10) << 3)  # an RLE block of one byte repeated 128 KiB times
        blocks = [struct.pack("<I", block)[:3] + b"\0"] * (mib * 8 - 1) + [struct.pack("<I", block | 1)[:3] + b"\0"]
        return b"\x28\xb5\x2f\xfd" + b"\x00" + bytes([7 << 3]) + b"".join(blocks)  # 128 KiB window
    # Raw deflate of a MiB with a full flush is the same bytes every time: repeat them, then an empty last block.
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    raw = (compressor.compress(zeros) + compressor.flush(zlib.Z_FULL_FLUSH)) * mib + b"\x03\x00"
    crc, adler = 0, 1
    for _ in range(mib):
        crc, adler = zlib.crc32(zeros, crc), zlib.adler32(zeros, adler)
    if coding == "gzip":
        return b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff" + raw + struct.pack("<II", crc, (mib << 20) & 0xFFFFFFFF)
    return b"\x78\xda" + raw + struct.pack(">I", adler)  # deflate: the zlib format, as RFC 9110 names it


def answer(status: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    lines = [f"HTTP/1.1 {status}", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


# path -> the bytes the origin writes, then closes. Each is a way an origin can answer that is not an image.
SHAPES: dict[str, tuple[bytes, str]] = {
    "no-location": (answer("302 Found", {"Content-Length": "0"}), "url_fetch_failed"),
    "not-modified": (answer("304 Not Modified", {}), "url_fetch_failed"),
    "to-data": (answer("302 Found", {"Location": "data:image/png;base64,AAAA", "Content-Length": "0"}),
                "url_not_allowed"),
    "to-mailto": (answer("301 Moved", {"Location": "mailto:a@example.com", "Content-Length": "0"}), "url_not_allowed"),
    "to-about": (answer("307 Moved", {"Location": "about:blank", "Content-Length": "0"}), "url_not_allowed"),
    "to-port-70000": (answer("302 Found", {"Location": "http://127.0.0.2:70000/a", "Content-Length": "0"}),
                      "url_not_allowed"),
    "to-no-url": (answer("302 Found", {"Location": "http://a\x7f.test/", "Content-Length": "0"}), "url_fetch_failed"),
    "bad-header": (b"HTTP/1.1 200 OK\r\nX-\x00Bad: v\r\nContent-Length: 3\r\n\r\nabc", "url_fetch_failed"),
    "no-colon": (b"HTTP/1.1 200 OK\r\nno colon\r\nContent-Length: 3\r\n\r\nabc", "url_fetch_failed"),
    "truncated": (answer("200 OK", {"Content-Length": "100000"}, b"abc"), "url_fetch_failed"),
    "bad-chunked": (answer("200 OK", {"Transfer-Encoding": "chunked"}, b"zz\r\nabc\r\n"), "url_fetch_failed"),
    "two-lengths": (b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabc", "url_fetch_failed"),
    "not-http": (b"SSH-2.0-OpenSSH_9.6\r\n", "url_fetch_failed"),
    "nothing": (b"", "url_fetch_failed"),
    "huge-header": (answer("200 OK", {"X": "a" * 200_000, "Content-Length": "3"}, b"abc"), "url_fetch_failed"),
    "encoded": (answer("200 OK", {"Content-Encoding": "gzip", "Content-Length": "20"}, zlib.compress(b"x")[:20]),
                "url_fetch_failed"),
    "reset": (b"", "url_fetch_failed"),  # headers, part of the body, then a TCP reset (Origin.reset)
}


class Origin:
    """A socket server on 127.0.0.2: each connection's first request gets `respond(path, head)`'s bytes."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.2", 0))
        self.base = f"http://127.0.0.2:{self.sock.getsockname()[1]}"
        self.heads: list[tuple[str, dict[str, str]]] = []
        self.holding = 0
        self.bodies: dict[str, bytes] = {}
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:
            data = b""
            while b"\r\n\r\n" not in data:
                got = conn.recv(65536)
                if not got:
                    return
                data += got
            line, *fields = data.split(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
            path = line.split(" ")[1]
            head = {k.strip().lower(): v.strip() for k, _, v in (f.partition(":") for f in fields)}
            self.heads.append((path, head))
            self.respond(conn, path.lstrip("/").split("?")[0])

    def respond(self, conn: socket.socket, path: str) -> None:
        if path == "reset":
            conn.sendall(answer("200 OK", {"Content-Length": "100000"}, b"x" * 1000))
            time.sleep(0.05)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        elif path in SHAPES:
            conn.sendall(SHAPES[path][0])
        elif path.startswith("bomb-"):
            coding = path.removeprefix("bomb-")
            body = self.bodies[coding]
            conn.sendall(answer("200 OK", {"Content-Type": "image/png", "Content-Encoding": coding,
                                           "Content-Length": str(len(body))}, body))
        elif path == "set-cookie":
            conn.sendall(answer("200 OK", {"Set-Cookie": "session=secret; Path=/", "Content-Length": str(len(IMAGE))},
                                IMAGE))
        elif path == "hold":  # headers, then nothing: the fetch holds its slot until its own timeout
            self.holding += 1
            conn.sendall(answer("200 OK", {"Content-Length": "1"}))
            time.sleep(HOLD_S)
        else:
            conn.sendall(answer("200 OK", {"Content-Length": str(len(IMAGE))}, IMAGE))
        time.sleep(0.02)  # let the client read before the close


@pytest.fixture(scope="module")
def origin() -> Iterator[Origin]:
    server = Origin()
    yield server
    server.sock.close()


def fetcher(**settings: Any) -> UrlFetcher:
    async def resolver(host: str, port: int) -> list[str]:
        return {"a.test": ["127.0.0.2"], "b.test": ["127.0.0.2"]}[host]  # two names on one address

    return UrlFetcher(FetchSettings(allowlist=("127.0.0.2/32",), **settings), resolver=resolver)


LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {"asyncio": asyncio.new_event_loop,
                                                             "uvloop": uvloop.new_event_loop}


def run(loop: str, make: Callable[[UrlFetcher], Any], f: UrlFetcher | None = None) -> Any:
    f = f or fetcher()

    async def go() -> Any:
        try:
            return await make(f)
        finally:
            await f.aclose()

    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        return runner.run(go())


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("shape", SHAPES)
def test_every_hostile_answer_is_the_contracts_error_on_either_loop(origin: Origin, shape: str, loop: str) -> None:
    with pytest.raises(ApiError) as caught:
        run(loop, lambda f: fetch_url_items([image_item(f"{origin.base}/{shape}", "input[0]")], f,
                                            time.monotonic() + 10))
    assert (caught.value.status, caught.value.error_type.value) == \
        ({"url_fetch_failed": 400, "url_not_allowed": 400}[SHAPES[shape][1]], SHAPES[shape][1])
    assert caught.value.message.startswith("input[0]: ") and "127.0.0.2" not in caught.value.message


@pytest.mark.parametrize("loop", LOOPS)
def test_a_port_out_of_range_is_refused_before_anything_connects(loop: str) -> None:
    for url in ("http://127.0.0.2:70000/a.jpg", "http://127.0.0.2:0/a.jpg", "http://a.test:99999999999/a.jpg"):
        with pytest.raises(ApiError) as caught:
            run(loop, lambda f, url=url: fetch_url_items([image_item(url, "input[0]")], f, time.monotonic() + 5))
        assert caught.value.error_type.value == "url_not_allowed" and "port" in caught.value.message


def test_bulk_writes_each_hostile_answer_as_a_row_of_its_errors_table(origin: Origin) -> None:
    items = [f"{origin.base}/{shape}" for shape in SHAPES] + ["http://127.0.0.2:70000/a.jpg", f"{origin.base}/ok"]
    block = {"shard": np.zeros(len(items), np.int64), "pos": np.arange(len(items)),
             "item": np.array(items, dtype=object)}
    out = stages.decode_batch(block, size=(32, 32), limits=ImageLimits(), fast_jpeg=True, model="tiny-siglip",
                              urls=FetchSettings(allowlist=("127.0.0.2/32",)))
    # /ok is fetched, and is no image.
    expected = [kind for _, kind in SHAPES.values()] + ["url_not_allowed", "unsupported_media_type"]
    assert list(out["error_type"]) == expected
    assert all(message and "127.0.0.2" not in message for message in out["message"])


def test_no_cookie_or_other_state_passes_from_one_fetch_to_another(origin: Origin) -> None:
    port = origin.base.rsplit(":", 1)[1]
    f = fetcher()  # one fetcher for every request, as an ingress replica has

    async def fetches(f: UrlFetcher) -> None:
        assert await f.fetch(f"{origin.base}/set-cookie", request="tenant A") == IMAGE
        for url in (f"{origin.base}/echo", f"http://a.test:{port}/echo", f"http://b.test:{port}/echo"):
            assert await f.fetch(url, request="tenant B") == IMAGE

    origin.heads.clear()
    run("asyncio", fetches, f)
    assert [path for path, _ in origin.heads] == ["/set-cookie", "/echo", "/echo", "/echo"]
    for _, head in origin.heads:
        assert "cookie" not in head
        # Only what every fetch sends: nothing a client, an origin or an earlier fetch could add to.
        assert set(head) == {"host", "accept", "accept-encoding", "connection", "user-agent"}
        assert head["accept-encoding"] == "identity" and head["connection"] == "close"


PEAK_SCRIPT = """
import asyncio, json, sys
import psutil
from siglip_serve.serve.http.errors import rejection_error
from siglip_serve.serve.http.url_errors import UrlRejected
from siglip_serve.serve.ingress.url_fetch import UrlFetcher
from siglip_serve.serve.plan.config import FetchSettings

def high_water_mark():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024

async def fetch(url):
    f = UrlFetcher(FetchSettings(allowlist=("127.0.0.2/32",)))
    try:
        return await f.fetch(url)
    finally:
        await f.aclose()

asyncio.run(fetch(sys.argv[1] + "/ok"))  # everything imported and warm
before = psutil.Process().memory_info().rss
try:
    got = ["fetched", len(asyncio.run(fetch(sys.argv[1] + "/bomb-" + sys.argv[2])))]
except UrlRejected as exc:
    error = rejection_error(exc, "input")
    got = [error.status, error.error_type.value, error.message]
print(json.dumps({"result": got, "peak_mib": (high_water_mark() - before) / 2**20}))
"""


@pytest.mark.parametrize("coding", ["br", "gzip", "deflate", "zstd"])
def test_a_compression_bomb_is_refused_unread_in_bounded_memory(origin: Origin, coding: str) -> None:
    origin.bodies[coding] = body = zero_bomb(coding, GIB)
    assert len(body) < 2 << 20  # a gibibyte of zeros, sent as at most 2 MiB
    out = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, origin.base, coding], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout)
    status, kind, message = got["result"]
    assert (status, kind) == (400, "url_fetch_failed") and f"Content-Encoding {coding}" in message
    # The bar is 100 MB over idle; a body that is never read or decoded costs next to nothing.
    assert got["peak_mib"] < 100, got


def test_a_second_requests_url_is_not_queued_behind_the_first_requests_slow_ones(origin: Origin) -> None:
    f = fetcher(concurrency=16, timeout_s=HOLD_S)
    origin.holding = 0

    async def scenario(f: UrlFetcher) -> float:
        slow = [image_item(f"{origin.base}/hold?{i}", f"input[{i}]") for i in range(256)]
        first = asyncio.ensure_future(fetch_url_items(slow, f, time.monotonic() + 60))
        while origin.holding < 12:  # all but the reserved quarter held by the first request, each to its timeout
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        assert origin.holding == 12 and f.slots.held == 12, (origin.holding, f.slots.held)
        began = time.monotonic()
        fetched = await fetch_url_items([image_item(f"{origin.base}/ok", "input[0]")], f, time.monotonic() + 3)
        waited = time.monotonic() - began
        assert fetched[0].value == IMAGE
        first.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await first
        return waited

    waited = run("asyncio", scenario, f)
    # First come, first served it waits for the whole queue; round-robin alone, for one held fetch's timeout.
    assert waited < 2, waited
