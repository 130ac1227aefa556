"""What tests share: the application under test, the HTTP contract's checks, test images, the
torch_neuronx test double, and a tiny checkpoint whose zero-shot answer is forced.

Test files import from here, never from one another or from conftest.py (pytest imports a
conftest as its own module, so a second import under `tests.conftest` would be a second copy
with its own state). conftest.py holds the fixtures and the one hardware-marker hook.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import shlex
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import numpy as np
from PIL import Image

from siglip_serve.core.poll import poll

REPO = Path(__file__).resolve().parent.parent
# The package's source (src layout): src/siglip_serve/<package>/.
SRC = REPO / "src" / "siglip_serve"
DOUBLES = REPO / "tests" / "doubles"
PLACEHOLDER = DOUBLES / "placeholder"

# -- the application under test -------------------------------------------------------------

# Logical NeuronCores declared by the test cluster (no Trainium here: it is a plain Ray resource).
TEST_NEURON_CORES = 2
# A custom Ray resource the test cluster declares for backends the tests register themselves
# (tests/integration/test_backend_seam.py): no real device stands behind it.
TEST_DEVICE = "siglip_test_device"
TEST_DEVICES = 2
API_KEY = "test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@dataclass
class ServeCluster:
    http_port: int
    base_url: str
    # Ray's Prometheus endpoint (http://127.0.0.1:<metrics_port>/metrics), as `--metrics-port` sets it.
    metrics_port: int
    # "haproxy" (the default, launcher/haproxy_front.py) or "python" (Serve's proxy actor).
    front_end: str = "haproxy"
    # HAProxy's Prometheus exporter (http://127.0.0.1:<port>/metrics); None with the python front end.
    haproxy_metrics_port: int | None = None


@dataclass
class TinyReference:
    """The tiny model run in-process, for checking what the server returns."""

    embedder: Any
    image_size: tuple[int, int]

    def embed(self, data: bytes) -> np.ndarray:
        import torch

        from siglip_serve.models.preprocess import preprocess_image

        array = preprocess_image(data, self.image_size)
        with torch.inference_mode():
            return self.embedder(torch.from_numpy(array)[None]).numpy()[0]


class ServeResponse:
    """Stands in for Serve's DeploymentResponse as the ingress uses it: awaitable once, cancellable.
    It does not prove Serve's own cancellation inside a replica (the integration tests run that)."""

    def __init__(self, work: Any) -> None:
        import asyncio

        self.task = asyncio.ensure_future(work)

    def __await__(self) -> Any:
        return self.task.__await__()

    def cancel(self) -> None:
        self.task.cancel()


class TowerHandle:
    """Stands in for a tower's deployment handle as the ingress uses it: `options(...)` (recorded, the same
    handle back) and `embed_chunks.remote(chunks, deadlines)`, answering after `seconds` a fixed vector per item
    (from a CRC of its pixels or its text; not normalised), recording how many items each call carried. It does
    not prove Serve's routing, a real replica's batching or its model (the integration tests run those)."""

    def __init__(self, seconds: float = 0.0) -> None:
        from ray.serve._private.handle_options import DynamicHandleOptions

        self.handle_options = DynamicHandleOptions()
        self.seconds = seconds
        self.items: list[int] = []
        handle = self

        class Method:
            def remote(self, chunks: list[Any], deadlines: list[float], *_: Any) -> ServeResponse:
                return ServeResponse(handle._embed(chunks))

        self.embed_chunks = Method()

    def options(self, **options: Any) -> TowerHandle:
        self.handle_options = self.handle_options.copy_and_update(**options)
        return self

    async def _embed(self, chunks: list[Any]) -> list[np.ndarray]:
        import asyncio

        await asyncio.sleep(self.seconds)
        self.items.extend(len(chunk) for chunk in chunks)
        return [np.stack([self.vector(item) for item in chunk]) for chunk in chunks]

    @staticmethod
    def vector(item: Any) -> np.ndarray:
        data = item.encode() if isinstance(item, str) else np.ascontiguousarray(item).tobytes()
        return np.random.default_rng(zlib.crc32(data)).standard_normal(4).astype(np.float32)


# What a warm replica of each tower publishes in the registry (serve/towers/tower_replica.py `publish`), in part.
STAND_IN_RECORDS = [{"tower": "image", "replica_id": "image-1", "warmup_seconds": {"8": 0.002}},
                    {"tower": "text", "replica_id": "text-1", "warmup_seconds": {"32": 0.003}, "context_length": 16,
                     "logit_scale": 10.0, "logit_bias": -10.0}]


def stand_in_ingress(image: TowerHandle, text: TowerHandle | None, **args: Any) -> Any:
    """An ingress (serve/ingress/ingress.py) of tiny-siglip's geometry with stand-in tower handles, its registry holding
    one warm replica per tower (no Ray: the caller keeps registry.is_draining from asking one). Its batchers bind
    to the first event loop that uses them: one asyncio.run (or one TestClient) per ingress."""
    from siglip_serve.models.model_info import ModelInfo
    from siglip_serve.serve.ingress.ingress import Ingress
    from siglip_serve.serve.plan.config import ServiceConfig
    from siglip_serve.serve.plan.planner import plan_service

    config = ServiceConfig.from_args({"model": "tiny-siglip", "ingress_replicas": 1, "replicas": 1,
                                      "text_replicas": 1 if text else 0, **args})
    records = STAND_IN_RECORDS if text else STAND_IN_RECORDS[:1]
    towers = {"image": image, **({"text": text} if text else {})}
    return Ingress({"tiny-siglip": towers}, plan_service(config),  # type: ignore[dict-item]
                   {"tiny-siglip": ModelInfo("tiny-siglip", 4, (64, 64), "random")}, replica=("test", "ingress-1"),
                   live_replicas=lambda app: list(records), refusal=lambda app, tower: None)


# Applications test modules deployed; conftest's module fixture deletes each module's when it ends,
# so the session cluster's logical CPUs hold only the apps still in use.
DEPLOYED: list[str] = []
# Applications deleted and not waited for: each drains for RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S
# while the next module runs (a replica that needs the CPUs they free waits for them in Serve), and the
# session's end checks that every one is gone (conftest's serve_cluster).
DELETING: set[str] = set()


def delete_apps(names: list[str]) -> None:
    """Ask Serve to delete `names`, without waiting: wait_for_deleted() checks later that they went."""
    from ray import serve

    for name in set(names) - DELETING:
        serve.delete(name, _blocking=False)
        DELETING.add(name)


def wait_for_deleted(timeout_s: float = 120) -> list[str]:
    """The applications of delete_apps() still there after `timeout_s` (none: every one went)."""
    from ray import serve

    left, _, _ = poll(lambda: sorted(DELETING & set(serve.status().applications)), lambda left: not left,
                      timeout_s=timeout_s, interval_s=0.1)
    DELETING.clear()
    return left


def deploy(name: str, route_prefix: str, wait: bool = True, routes: tuple[Any, ...] = (), **args: object) -> None:
    """Build the real application from Serve-YAML-style args and run it under `route_prefix`, with `routes`
    (serve/ingress/http_app.py's Route or Probe) beside the contract's.

    One encoder replica and no text replica unless a test asks (`replicas=2`, `text_replicas=1`):
    each costs a process on a small shared cluster."""
    from ray import serve
    from ray.serve.api import _run

    from siglip_serve.serve.app import build_app_with_routes

    DEPLOYED.append(name)
    DELETING.discard(name)  # deployed again: the new application is not one to wait out
    app = build_app_with_routes({"model": "tiny-siglip", "replicas": 1, "text_replicas": 0, **args}, routes)
    if wait:
        serve.run(app, name=name, route_prefix=route_prefix)
    else:
        # Serve's public run() waits until every replica runs; this test needs the app half-up.
        _run(app, name=name, route_prefix=route_prefix, _blocking=False)


def wait_until_ready(url: str, timeout_s: float, process: subprocess.Popen | None = None,
                     detail: Callable[[], str] = lambda: "") -> float:
    """GET `url` until it answers 200 (core.poll); fail at once if `process` has exited.

    Returns the seconds waited; `detail()` (a log's tail, say) goes into the failure message."""
    def attempt() -> int | None:
        if process is not None and process.poll() is not None:
            raise AssertionError(f"exited with {process.returncode} before {url} was ready: {detail()}")
        try:
            return httpx.get(url, timeout=5).status_code
        except httpx.TransportError:
            return None

    _, ready, waited = poll(attempt, lambda status: status == 200, timeout_s, interval_s=0.5)
    assert ready, f"{url} not ready after {waited:.0f} s: {detail()}"
    return waited


# -- the systemd unit (deploy/systemd/siglip-serve.service) ----------------------------------

SYSTEMD_UNIT = REPO / "deploy" / "systemd" / "siglip-serve.service"


def read_unit(path: Path = SYSTEMD_UNIT) -> dict[str, dict[str, list[str]]]:
    """section -> key -> values, in order (a key such as Environment= may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, value = line.split("=", 1)
        current.setdefault(key, []).append(value)
    return sections


def unit_environment(unit: dict[str, dict[str, list[str]]]) -> dict[str, str]:
    pairs = [word.split("=", 1) for value in unit["Service"].get("Environment", []) for word in shlex.split(value)]
    return {key: value for key, value in pairs}


def unit_command(unit: dict[str, dict[str, list[str]]], environment: dict[str, str] | None = None) -> list[str]:
    """ExecStart= as systemd runs it: words split as a shell would, and an unquoted `$NAME` replaced by the
    words of its value (systemd.service(5), "Command lines"); `environment` overrides the unit's."""
    env = {**unit_environment(unit), **(environment or {})}
    words: list[str] = []
    for word in shlex.split(unit["Service"]["ExecStart"][0]):
        words.extend(env[word[1:]].split() if word.startswith("$") else [word])
    return words


# -- the HTTP contract (docs/http-api.md) ---------------------------------------------------

def assert_error(response: httpx.Response, status: int, error_type: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == status
    assert body["error"]["type"] == error_type
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    error: dict[str, Any] = body["error"]
    return error


def embeddings_of(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "list" and body["model"] == "tiny-siglip"
    assert [item["index"] for item in body["data"]] == list(range(len(body["data"])))
    assert body["usage"]["images"] == len(body["data"])
    return np.array([item["embedding"] for item in body["data"]], dtype=np.float32)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


# -- test images ----------------------------------------------------------------------------

MiB = 1024 * 1024


def jpeg_bytes(array: np.ndarray, quality: int = 90) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def png_chunk(kind: bytes, data: bytes) -> bytes:
    """One PNG chunk: length, type, data, CRC."""
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_file(width: int, height: int, bit_depth: int, colour_type: int, idat: bytes) -> bytes:
    """A PNG of one IDAT chunk holding `idat` (compressed scanlines), whatever its header declares."""
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, colour_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", idat) + png_chunk(b"IEND", b"")


def streamed_png(width: int, height: int, bit_depth: int, colour_type: int, row: bytes) -> bytes:
    """A valid PNG of `height` copies of one filtered row, compressed row by row (never whole in memory)."""
    comp = zlib.compressobj(9)
    parts = []
    line = b"\x00" + row
    step = max(1, (4 * MiB) // len(line))
    for start in range(0, height, step):
        parts.append(comp.compress(line * min(step, height - start)))
    parts.append(comp.flush())
    return png_file(width, height, bit_depth, colour_type, b"".join(parts))


# -- requests in the background while a test changes the service -------------------------------

class BackgroundLoad:
    """One thread per (label, JSON body) posting it to `path` back to back until the block ends; each answer's
    status (or transport error, or a non-200's first words) counted under its label in `got`. A change made
    under it that drops or fails a request shows there."""

    def __init__(self, base_url: str, headers: dict[str, str], bodies: list[tuple[str, dict[str, Any]]],
                 path: str = "/v1/embeddings") -> None:
        self.base_url, self.headers, self.path = base_url, headers, path
        self.stop = threading.Event()
        self.got: Counter[tuple[str, str]] = Counter()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(label, body), daemon=True) for label, body in bodies]

    def _run(self, label: str, body: dict[str, Any]) -> None:
        with httpx.Client(base_url=self.base_url, headers=self.headers, timeout=60) as client:
            while not self.stop.is_set():
                try:
                    answer = client.post(self.path, json=body)
                    outcome = "200" if answer.status_code == 200 else f"{answer.status_code} {answer.text[:200]}"
                except httpx.TransportError as exc:
                    outcome = f"transport {type(exc).__name__}"
                with self.lock:
                    self.got[(label, outcome)] += 1

    def total(self) -> int:
        with self.lock:
            return sum(self.got.values())

    def outcomes(self) -> set[str]:
        with self.lock:
            return {outcome for _, outcome in self.got}

    def __enter__(self) -> BackgroundLoad:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=90)


# -- an image server on a loopback address (images by URL) --------------------------------------

class FileServer:
    """HTTP on one loopback address (127.0.0.2, 127.0.0.3: tests send nothing elsewhere) serving `files` by path,
    `/redirect?<url>` (302 to it), `/slow/<path>` (the file after `slow_s`) and `/held/<path>` (the file once
    `release` is set, or after 180 s); it records each request's (path, Host) and the most requests it held at
    once. A context manager: at its end held requests are released and the server stops."""

    def __init__(self, host: str, files: dict[str, bytes], slow_s: float = 0.5) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from urllib.parse import unquote

        self.files, self.slow_s = files, slow_s
        self.hits: list[tuple[str, str | None]] = []
        self.active = self.most_active = 0
        self.release = threading.Event()
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                outer.hits.append((self.path, self.headers.get("Host")))
                path, _, query = self.path.partition("?")
                with lock:
                    outer.active += 1
                    outer.most_active = max(outer.most_active, outer.active)
                try:
                    if path == "/redirect":
                        self._send(302, b"", {"Location": unquote(query)})
                        return
                    if path.startswith("/slow/"):
                        time.sleep(outer.slow_s)
                        path = path[len("/slow"):]
                    elif path.startswith("/held/"):
                        outer.release.wait(timeout=180)
                        path = path[len("/held"):]
                    body = outer.files.get(path)
                    self._send(200 if body is not None else 404, body or b"")
                finally:
                    with lock:
                        outer.active -= 1

            def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for name, value in {"Content-Length": str(len(body)), **(headers or {})}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.base = f"http://{host}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def __enter__(self) -> FileServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


# -- the torch_neuronx test double (tests/doubles/torch_neuronx) ----------------------------
# The double is put on sys.path only inside `neuronx_double()`, never at import: conftest decides
# at collection whether the real SDK is present, and other tests must not see the double.

@contextlib.contextmanager
def torch_neuronx_from(path: Path | None) -> Iterator[None]:
    """Make `import torch_neuronx` resolve from `path` (None: not at all), then restore."""
    saved_module = sys.modules.pop("torch_neuronx", None)
    saved_path = list(sys.path)
    sys.path[:] = [p for p in sys.path if not p.startswith(str(DOUBLES))]
    if path is not None:
        sys.path.insert(0, str(path))
    try:
        yield
    finally:
        sys.path[:] = saved_path
        sys.modules.pop("torch_neuronx", None)
        if saved_module is not None:
            sys.modules["torch_neuronx"] = saved_module


@contextlib.contextmanager
def neuronx_double() -> Iterator[ModuleType]:
    """The double, imported fresh (its CALLS empty)."""
    with torch_neuronx_from(DOUBLES):
        import torch_neuronx

        assert "test double" in (torch_neuronx.__doc__ or ""), torch_neuronx.__file__
        yield torch_neuronx


def tiny_settings(**overrides: Any) -> Any:
    from siglip_serve.models.settings import ModelSettings

    return ModelSettings(**{"model": "tiny-siglip", "buckets": (1, 2), "torch_threads": 1, **overrides})


def worker_pythonpath() -> str:
    """PYTHONPATH that lets Ray workers and subprocesses import the double and this checkout."""
    return f"{DOUBLES}:{REPO}"


def neuron_env() -> dict[str, str]:
    """The Neuron part of this process's environment (imports may set other variables themselves)."""
    return {k: v for k, v in os.environ.items() if k.startswith(("NEURON_", "TORCH_NEURONX_"))}


# -- a small tokenizer and a checkpoint whose zero-shot answer is forced --------------------
# `forced_checkpoint` builds tiny-siglip-checkpoint (tiny-siglip's architecture, which accepts a
# checkpoint) so that:
# - the image tower ignores its input: the attention pool's projection has zero weights and bias `v`,
#   its MLP adds nothing, so every image embeds to normalize(v);
# - the text tower pools the mean of its token embeddings: queries and keys are zero (uniform attention),
#   values and the output projection are identities, the MLP adds nothing, position embeddings and every
#   token but the label words are zero. A prompt holding label word k then embeds along LayerNorm(e_k);
# - v = LayerNorm(e_winner), so the winner's cosine is 1 and every other label's is about -0.016.
# With logit_scale = log(10) and logit_bias = -5, the winner scores sigmoid(5) ~ 0.993 for ANY image and
# the others sigmoid(-5.16) ~ 0.0057.

CHECKPOINT_MODEL = "tiny-siglip-checkpoint"
LABEL_WORDS = ("cat", "dog", "car", "tree", "boat")
PROMPT_WORDS = ("a", "photo", "of", "the")
FORCED_SCALE = math.log(10.0)
FORCED_BIAS = -5.0


def small_tokenizer(directory: Path, context_length: int = 16) -> Path:
    from siglip_serve.models.tiny_tokenizer import build_tokenizer, tiny_model_cfg

    cfg = tiny_model_cfg(context_length)
    return build_tokenizer(directory, [*PROMPT_WORDS, *LABEL_WORDS, "rocket", "coffee"], context_length, cfg)


def word_id(word: str) -> int:
    from siglip_serve.models.tiny_tokenizer import SPECIALS

    return len(SPECIALS) + [*PROMPT_WORDS, *LABEL_WORDS].index(word)


def forced_checkpoint(path: Path, winner: str) -> Path:
    import torch

    from siglip_serve.models.loading import open_clip_module

    open_clip = open_clip_module()
    torch.manual_seed(1)
    model = open_clip.create_model(CHECKPOINT_MODEL, pretrained=None)
    width = model.text.width
    with torch.no_grad():
        text = model.text
        text.positional_embedding.zero_()
        text.token_embedding.weight.zero_()
        for i, word in enumerate(LABEL_WORDS):
            text.token_embedding.weight[word_id(word), i] = 10.0
        for block in text.transformer.resblocks:
            attn = block.attn
            attn.in_proj_weight.zero_()
            attn.in_proj_bias.zero_()
            attn.in_proj_weight[2 * width:] = torch.eye(width)  # V = identity; Q = K = 0: uniform attention
            attn.out_proj.weight.copy_(torch.eye(width))
            attn.out_proj.bias.zero_()
            for norm in (block.ln_1, block.ln_2):
                norm.weight.fill_(1.0)
                norm.bias.zero_()
            block.mlp.c_proj.weight.zero_()
            block.mlp.c_proj.bias.zero_()
        text.ln_final.weight.fill_(1.0)
        text.ln_final.bias.zero_()
        text.text_projection.weight.copy_(torch.eye(width))
        text.text_projection.bias.zero_()
        # ln_1 of the residual stream feeds V; with identities the pooled row is x_last + mean(LN(x_j)).
        # Computing the winner's text embedding with the model itself keeps v exact.
        ids = torch.full((1, text.context_length), 1, dtype=torch.long)
        ids[0, 0] = word_id(winner)
        target = torch.nn.functional.normalize(text(ids), dim=-1)[0]
        pool = model.visual.trunk.attn_pool
        pool.proj.weight.zero_()
        pool.proj.bias.copy_(target)
        pool.mlp.fc2.weight.zero_()
        pool.mlp.fc2.bias.zero_()
        model.logit_scale.fill_(FORCED_SCALE)
        model.logit_bias.fill_(FORCED_BIAS)
    torch.save(model.state_dict(), path)
    return path
