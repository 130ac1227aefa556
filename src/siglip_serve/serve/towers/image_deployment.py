"""The image tower's replica: one per logical NeuronCore (or per configured CPU/GPU worker), as the plan says.

Requests arrive as uint8 chunks of at most the largest bucket's images (or JPEG files, decoded on
the device); serve/towers/tower_replica.py gathers chunks from many requests into one forward pass of the
model's buckets, as for the text tower; chunks of different shapes (a NaFlex model's patch budgets) run as
batches of their own.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

from siglip_serve.core.constants import LNC_ENV, VISIBLE_CORES_ENV
from siglip_serve.models.device_decode import JpegFiles
from siglip_serve.serve.plan.replica_slices import TowerRun
from siglip_serve.serve.plan.service_plan import TowerPlan
from siglip_serve.serve.shared import registry
from siglip_serve.serve.shared.metrics import TowerMetrics
from siglip_serve.serve.towers.tower_replica import TowerReplica, build_tower, split_rows, start_served

log = logging.getLogger("siglip_serve.encoder")


class ImageReplica(TowerReplica):
    """The image tower; published (serve/shared/registry.py) once warm with the cores it sees."""

    def __init__(self, run: TowerRun, plan: TowerPlan, companions: Sequence[Any] = ()) -> None:
        """`companions`: the model's other towers' handles where this tower is its own application's ingress
        (serve/app.py `build_model_app`): bound here only so that Serve deploys them in that application."""
        tower, start = build_tower(run, plan, "image")
        from siglip_serve.models.encoder import EncoderInputError

        self._input_error = EncoderInputError
        super().__init__(run, tower, TowerMetrics(plan.served_as, tower="image"), start)
        # The devices Ray gave it, by the variable that names them (e.g. neuron_rt_visible_cores).
        held: dict[str, str | None] = {registry.SERVED_AS: plan.served_as, registry.DEPLOYMENT: plan.deployment.name}
        held.update({name.lower(): os.environ.get(name) for name in plan.visible_devices_env})
        if VISIBLE_CORES_ENV in plan.visible_devices_env or LNC_ENV in os.environ:
            held["neuron_logical_nc_config"] = os.environ.get(LNC_ENV)
        self.publish(held)
        log.info("encoder replica ready: %s", self.info)

    def refusal(self, chunk: Any) -> Exception | None:
        if isinstance(chunk, JpegFiles):
            return None  # checked as it is decoded on the device
        try:
            self.tower.check_input(chunk)
        except self._input_error as exc:
            return exc
        return None

    def encode_chunks(self, chunks: list[Any]) -> list[Any]:
        """One forward pass over the chunks (JPEG files decoded on the model's device first): each
        chunk's embeddings, or the decode error that chunk alone failed with."""
        if not any(isinstance(chunk, JpegFiles) for chunk in chunks):
            return encode_by_shape(partial(self.tower.encode, on_forward=self.metrics.forward), chunks)
        import torch

        from siglip_serve.models.device_decode import DeviceDecodeError, decode_resize
        from siglip_serve.models.image_errors import CorruptImage

        device = self.tower.device
        pixels: list[Any] = []
        for chunk in chunks:
            try:
                pixels.append(decode_resize(chunk.files, self.tower.image_size, device)
                              if isinstance(chunk, JpegFiles) else torch.from_numpy(chunk).to(device))
            except DeviceDecodeError:
                pixels.append(CorruptImage("image data is truncated or corrupt"))
        good = [p for p in pixels if not isinstance(p, Exception)]
        embeddings = self.tower.encode(torch.cat(good), self.metrics.forward) if good else None
        parts = iter(split_rows(embeddings, [len(p) for p in good]) if good else [])
        return [p if isinstance(p, Exception) else next(parts) for p in pixels]


def encode_by_shape(encode: Callable[[np.ndarray], np.ndarray], chunks: list[np.ndarray]) -> list[np.ndarray]:
    """Each chunk's embeddings, the chunks of one input shape run as one batch: a NaFlex model's chunks of
    different patch budgets (models/naflex.py) are different buckets and never share a forward pass; every
    other model's chunks are one shape, one batch."""
    by_shape: dict[tuple[int, ...], list[int]] = {}
    for index, chunk in enumerate(chunks):
        by_shape.setdefault(tuple(chunk.shape[1:]), []).append(index)
    out: list[np.ndarray] = [np.empty(0)] * len(chunks)
    for indices in by_shape.values():
        embeddings = encode(np.concatenate([chunks[i] for i in indices]))
        for index, rows in zip(indices, split_rows(embeddings, [len(chunks[i]) for i in indices]), strict=True):
            out[index] = rows
    return out


class ServedImageReplica(ImageReplica):
    """ImageReplica as Serve deploys it: it waits for its artifact volume before it is built."""

    # Serve awaits an async constructor (ray/serve/_private/replica.py UserCallableWrapper.initialize_callable).
    async def __init__(self, run: TowerRun, plan: TowerPlan, companions: Sequence[Any] = ()) -> None:
        await start_served("image", run, lambda: ImageReplica.__init__(self, run, plan, companions))
