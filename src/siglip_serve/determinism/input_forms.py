"""The bytes the ingress reads from each input form (serve/http/http_body.py, serve/ingress/url_fetch.py): a raw
body, a multipart file part, a base64 data URI in a JSON body, and a URL fetched from a loopback HTTP server
the way the ingress fetches one (its allowlist holding only 127.0.0.1)."""

from __future__ import annotations

import asyncio
import base64
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import orjson
from starlette.requests import Request

from siglip_serve.serve.http.http_body import decode_base64_image, multipart_form
from siglip_serve.serve.ingress.url_fetch import UrlFetcher
from siglip_serve.serve.plan.live_settings import FetchSettings

FORMS: tuple[str, ...] = ("raw", "multipart", "base64-json", "url")
LOOPBACK = "127.0.0.1"


def multipart_bytes(files: Mapping[str, bytes]) -> list[bytes]:
    """Each file as the ingress reads it from a multipart body that httpx (a real client) encoded."""
    sent = httpx.Request("POST", "http://ingress/v1/embeddings/image",
                         files=[("file", (f"{name}.jpg", data, "image/jpeg")) for name, data in files.items()])
    body = sent.read()
    request = Request({"type": "http", "method": "POST", "path": "/",
                       "headers": [(b"content-type", sent.headers["content-type"].encode())]})
    parts, _ = asyncio.run(multipart_form(request, body))
    return [data for _, data in parts]


def base64_json_bytes(files: Mapping[str, bytes]) -> list[bytes]:
    """Each file as the ingress reads it from a JSON body of data URIs."""
    body = orjson.dumps({"input": [{"image": "data:image/jpeg;base64," + base64.b64encode(data).decode("ascii")}
                                   for data in files.values()]})
    return [decode_base64_image(item["image"]) for item in orjson.loads(body)["input"]]


class _Files(BaseHTTPRequestHandler):
    files: Mapping[str, bytes] = {}

    def do_GET(self) -> None:
        data = self.files.get(self.path.strip("/").removesuffix(".jpg"))
        if data is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "image/jpeg")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def loopback_server(files: Mapping[str, bytes]) -> Iterator[str]:
    """An HTTP server on 127.0.0.1 (a free port) answering /NAME.jpg with the file; its base URL."""
    handler = type("Files", (_Files,), {"files": dict(files)})
    server = ThreadingHTTPServer((LOOPBACK, 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="determinism-files", daemon=True)
    thread.start()
    try:
        yield f"http://{LOOPBACK}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def url_bytes(files: Mapping[str, bytes]) -> list[bytes]:
    """Each file fetched by URL, by the ingress's fetcher, from a loopback server."""
    async def fetch(base: str) -> list[bytes]:
        fetcher = UrlFetcher(FetchSettings(allowlist=(f"{LOOPBACK}/32",)))
        try:
            return [await fetcher.fetch(f"{base}/{name}.jpg") for name in files]
        finally:
            await fetcher.aclose()

    with loopback_server(files) as base:
        return asyncio.run(fetch(base))


def read_forms(files: Mapping[str, bytes]) -> dict[str, list[bytes]]:
    """form -> each file's bytes as the ingress reads them from that form, in `files`' order."""
    return {"raw": list(files.values()), "multipart": multipart_bytes(files), "base64-json": base64_json_bytes(files),
            "url": url_bytes(files)}
