"""Shared fixtures: real photos, a tiny-model reference, and a real local Ray Serve on loopback.

Integration tests run the real application (`serve.app.build`) on `tiny-siglip` under a Ray
started here, on 127.0.0.1 only, and stop it at the end of the session.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
from PIL import Image

from serve.runner import free_port

# Tests pin their own Ray: loopback, no token prompts, no usage reporting.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

# Logical NeuronCores declared by the test cluster (no Trainium here: it is a plain Ray resource).
TEST_NEURON_CORES = 4
API_KEY = "test-key"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    neuron_ok = _neuron_sdk_present()
    native_problem = _torchneuron_problem()
    for item in items:
        if "neuron" in item.keywords and not neuron_ok:
            item.add_marker(pytest.mark.skip(reason="needs a Trainium2 with the Neuron SDK (torch-neuronx); none here"))
        if "neuron_native" in item.keywords and native_problem:
            item.add_marker(pytest.mark.skip(reason=f"needs a Trainium2 with TorchNeuron: {native_problem}"))
        if "cuda" in item.keywords and not _cuda_present():
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU; none here"))


def _neuron_sdk_present() -> bool:
    try:
        import torch_neuronx  # noqa: F401
    except Exception:  # noqa: BLE001 - PyPI's placeholder or nothing: either way no SDK
        return False
    return hasattr(torch_neuronx, "trace")


def _torchneuron_problem() -> str | None:
    """Why the TorchNeuron line (torch-neuronx 2.14) cannot run here, or None. The trace line's
    check above cannot tell: both lines are the distribution torch-neuronx."""
    from models.torchneuron_env import TorchNeuronRefusal, check_native_sdk, installed_versions

    try:
        check_native_sdk(installed_versions())
    except TorchNeuronRefusal as exc:
        return str(exc).split(";")[0]
    return None


def _cuda_present() -> bool:
    import torch

    return torch.cuda.is_available()




def jpeg_bytes(array: np.ndarray, quality: int = 90) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


@pytest.fixture(scope="session")
def photos() -> list[np.ndarray]:
    """Real photographs shipped with scikit-image, as RGB uint8 arrays."""
    from skimage import data

    return [data.astronaut(), data.chelsea(), data.coffee(), data.rocket(), data.immunohistochemistry()]


@pytest.fixture(scope="session")
def photo_jpegs(photos: list[np.ndarray]) -> list[bytes]:
    return [jpeg_bytes(p) for p in photos]


@dataclass
class TinyReference:
    """The tiny model run in-process, for checking what the server returns."""

    embedder: object
    image_size: tuple[int, int]

    def embed(self, data: bytes) -> np.ndarray:
        import torch

        from models.preprocess import preprocess_image

        array = preprocess_image(data, self.image_size)
        with torch.inference_mode():
            return self.embedder(torch.from_numpy(array)[None]).numpy()[0]  # type: ignore[operator]


@pytest.fixture(scope="session")
def tiny_reference() -> TinyReference:
    from models.loading import load_embedder
    from models.settings import ModelSettings

    embedder, info = load_embedder(ModelSettings(model="tiny-siglip"))
    return TinyReference(embedder, info.image_size)


@dataclass
class ServeCluster:
    http_port: int
    base_url: str
    # Ray's Prometheus endpoint (http://127.0.0.1:<metrics_port>/metrics), as `--metrics-port` sets it.
    metrics_port: int
    # "haproxy" (the default, serve/haproxy_front.py) or "python" (Serve's proxy actor).
    front_end: str = "haproxy"


@pytest.fixture(scope="session")
def serve_cluster() -> Iterator[ServeCluster]:
    """A local Ray (16 logical CPUs, 4 declared neuron_cores) with Serve's front end on a free port:
    the default HAProxy one, or Serve's proxy actor with SIGLIP_TEST_FRONT_END=python."""
    import ray
    from ray import serve

    from serve.haproxy_front import use_front_end

    front_end = os.environ.get("SIGLIP_TEST_FRONT_END", "haproxy")
    saved = dict(os.environ)
    use_front_end(front_end, local_only=True)
    port = free_port()
    metrics_port = free_port()
    ray.init(
        num_cpus=16,
        resources={"neuron_cores": TEST_NEURON_CORES},
        _node_ip_address="127.0.0.1",
        include_dashboard=False,
        namespace="siglip-serve-tests",
        log_to_driver=False,
        _metrics_export_port=metrics_port,
        # Workers push metrics every second (Ray's default is 10 s), so scrapes see them quickly.
        _system_config={"metrics_report_interval_ms": 1000},
    )
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    # This Ray's processes have the front end's environment now; services the tests start as
    # subprocesses must not inherit its ports.
    os.environ.clear()
    os.environ.update(saved)
    try:
        yield ServeCluster(port, f"http://127.0.0.1:{port}", metrics_port, front_end)
    finally:
        serve.shutdown()
        ray.shutdown()


# Applications a test module deployed; each module's are deleted when it ends (see _delete_module_apps),
# so the session cluster's logical CPUs hold only the apps still in use.
_DEPLOYED: list[str] = []


def deploy(name: str, route_prefix: str, wait: bool = True, **args: object) -> None:
    """Build the real application from Serve-YAML-style args and run it under `route_prefix`.

    Text replicas are off unless a test asks for them (`text_replicas=1`): each costs a process."""
    from ray import serve
    from ray.serve.api import _run

    from serve.app import build_app

    _DEPLOYED.append(name)
    app = build_app({"model": "tiny-siglip", "text_replicas": 0, **args})
    if wait:
        serve.run(app, name=name, route_prefix=route_prefix)
    else:
        # Serve's public run() waits until every replica runs; this test needs the app half-up.
        _run(app, name=name, route_prefix=route_prefix, _blocking=False)


@pytest.fixture(scope="module", autouse=True)
def _delete_module_apps() -> Iterator[None]:
    """Delete the apps a module deployed once it ends (the session's `main` app stays)."""
    before = len(_DEPLOYED)
    yield
    names = [name for name in _DEPLOYED[before:] if name != "main"]
    del _DEPLOYED[before:]
    if names:
        import ray
        from ray import serve

        if ray.is_initialized():
            for name in dict.fromkeys(names):
                serve.delete(name, _blocking=True)


@pytest.fixture(scope="session")
def main_app(serve_cluster: ServeCluster) -> str:
    """tiny-siglip, one replica per declared NeuronCore (and one text replica), with an API key."""
    deploy(
        "main", "/", replicas=TEST_NEURON_CORES, neuron_cores_per_replica=1, api_key=API_KEY, text_replicas=1,
        encoder_num_cpus=0.5, batch_wait_timeout_s=0.01, torch_threads=1,
    )
    return serve_cluster.base_url
