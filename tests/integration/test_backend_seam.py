"""The backend seam: a backend this test registers (its record and its runner here, no file of the
project touched) is placed, warmed and served by the real application, each replica of either tower
holding what its record asks of Ray (a custom resource the session's cluster declares).

`DeviceDoubleRunner` runs the tiny model on the CPU under another name: it proves that the record alone
decides placement (the resource) and its runner the padding to buckets, that the replicas and the ingress
find a backend registered in the driver, and that a new backend needs nothing but its record and runner. It does not
prove any real device: nothing stands behind the resource.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from torch import nn

from siglip_serve.core.backends import BackendRecord, registered
from siglip_serve.models.backends.eager import eager_tower
from siglip_serve.models.backends.implementation import Implementation
from siglip_serve.models.settings import ModelSettings
from siglip_serve.models.tower import Runner
from tests.helpers import REPO, TEST_DEVICE, TEST_DEVICES, TinyReference, cosine, deploy, embeddings_of

NAME = "test-device"
TIMEOUT = 60.0


class DeviceDoubleRunner(Runner):
    """The tiny model on the CPU, recording the Ray resources its replica was given."""

    backend = NAME
    static_shapes = True  # every chunk padded to a bucket, as a compiled runner has it

    def __init__(self, module: nn.Module) -> None:
        import ray
        from ray._private.worker import WORKER_MODE, global_worker

        self.module = module
        in_replica = ray.is_initialized() and global_worker.mode == WORKER_MODE  # not the test's own process
        self.assigned = ray.get_runtime_context().get_assigned_resources() if in_replica else {}
        self.sizes: list[int] = []

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        self.sizes.append(int(batch.shape[0]))
        with torch.inference_mode():
            return self.module(batch)

    def describe(self) -> dict[str, Any]:
        return {"assigned_resources": self.assigned}


IMPLEMENTATION = Implementation(
    build=lambda settings, tower: eager_tower(settings, tower, lambda module, *_: DeviceDoubleRunner(module)))
RECORD = BackendRecord(NAME, device="cpu", implementation=f"{__name__}:IMPLEMENTATION", ray_resource=TEST_DEVICE,
                       per_replica=1)
# A replica imports this module by the name pytest gave it.
PYTHONPATH = f"{Path(__file__).resolve().parent}:{REPO}"


@pytest.fixture(scope="module")
def seam_app(serve_cluster) -> Iterator[str]:
    import ray

    with registered(RECORD):
        before = ray.available_resources().get(TEST_DEVICE, 0)
        deploy("seam", "/seam", backend=NAME, replicas=1, text_replicas=1, buckets=[1, 2, 4], text_buckets=[1, 4],
               encoder_num_cpus=0.25, text_num_cpus=0.25, ingress_num_cpus=0.25, ingress_replicas=1, torch_threads=1,
               batch_wait_timeout_s=0.01, env_vars={"PYTHONPATH": PYTHONPATH})
        assert before == TEST_DEVICES
        yield f"{serve_cluster.base_url}/seam"


def test_the_plan_asks_ray_for_the_records_resource() -> None:
    from siglip_serve.serve.plan.config import ServiceConfig
    from siglip_serve.serve.plan.placement import replica_asks

    with registered(RECORD):
        asks = replica_asks(ServiceConfig(model="tiny-siglip", backend=NAME, encoder_num_cpus=0.25, text_num_cpus=0.5))
    assert asks.image.actor_options() == {"num_cpus": 0.25, "resources": {TEST_DEVICE: 1}}
    assert asks.text.actor_options() == {"num_cpus": 0.5, "resources": {TEST_DEVICE: 1}}
    with pytest.raises(ValueError, match=f"unknown backend '{NAME}'"):  # gone with its registration
        ServiceConfig(model="tiny-siglip", backend=NAME)


def test_its_towers_run_on_its_runner_padded_as_its_runner_says() -> None:
    from siglip_serve.models.backends.implementation import create_encoder, create_text_encoder

    with registered(RECORD):
        settings = ModelSettings(model="tiny-siglip", backend=NAME, buckets=(1, 4), text_buckets=(1, 4),
                                 torch_threads=1)
        image, text = create_encoder(settings), create_text_encoder(settings)
    images = np.random.default_rng(0).integers(0, 256, (3, 3, 64, 64), dtype=np.uint8)
    image.encode(images)
    text.encode(["a", "b", "c"])
    assert isinstance(image.runner, DeviceDoubleRunner) and isinstance(text.runner, DeviceDoubleRunner)
    assert image.runner.sizes == text.runner.sizes == [4]  # 3 inputs, padded to bucket 4


def test_a_registered_backend_is_placed_warmed_and_served(seam_app: str, photo_jpegs: list[bytes],
                                                         tiny_reference: TinyReference) -> None:
    import ray

    # Both replicas (one image, one text) hold one of the two declared devices each.
    assert ray.available_resources().get(TEST_DEVICE, 0) == 0
    with httpx.Client(base_url=seam_app, timeout=TIMEOUT) as client:
        assert client.get("/readyz").status_code == 200
        response = client.post("/v1/embeddings/image", content=photo_jpegs[0], headers={"Content-Type": "image/jpeg"})
        got = embeddings_of(response)
        assert cosine(got[0], tiny_reference.embed(photo_jpegs[0])) >= 0.9999
        text = client.post("/v1/embeddings", json={"input": ["a photo of a cat"], "modality": "text"})
        assert text.status_code == 200, text.text
        assert np.isclose(np.linalg.norm(text.json()["data"][0]["embedding"]), 1.0, atol=1e-5)
        model = client.get("/v1/models").json()["data"][0]
    assert model["backend"] == NAME and len(model["replicas"]) == 1
    for replica in [*model["replicas"], model["text"]]:
        assert replica["backend"] == NAME and replica["static_shapes"] is True
        assert replica["assigned_resources"][TEST_DEVICE] == 1
        # Warmed before it served: every bucket of its tower.
        assert set(map(int, replica["warmup_seconds"])) == set(replica.get("buckets") or replica["text_buckets"])
