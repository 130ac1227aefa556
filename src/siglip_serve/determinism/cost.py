"""What `deterministic: true` costs: the same photos through each tower, alternating tower by tower round by
round (a shared machine's load drifts between minutes), as single-image calls and as calls of the largest
bucket. Per tower process: images per second and CPU-ms per image (every thread of this process: the tower's
torch threads), so a one-thread deterministic tower is compared per core as well as per call."""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from siglip_serve.determinism.comparisons import use


def time_calls(encoder: Any, calls: list[np.ndarray]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) for `calls`, each one `encode`."""
    use(encoder)
    wall, cpu = time.perf_counter(), time.process_time()
    for batch in calls:
        encoder.encode(batch)
    return time.perf_counter() - wall, time.process_time() - cpu


def workloads(encoder: Any, images: np.ndarray, repeats: int) -> dict[str, list[np.ndarray]]:
    """name -> its calls: every photo alone, and the photos in calls of the largest bucket (cycling)."""
    size = encoder.max_batch_size
    order = np.resize(np.arange(len(images)), size * max(1, len(images) // size))
    return {"single": [images[i:i + 1] for i in range(len(images))] * repeats,
            f"batch of {size}": [images[order[k:k + size]] for k in range(0, len(order), size)] * repeats}


def measure_cost(encoders: Mapping[str, Any], images: np.ndarray, rounds: int,
                 repeats: int = 2) -> list[dict[str, Any]]:
    """Rows of (configuration, workload, img/s and CPU-ms per image: each round's and the median)."""
    samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for encoder in encoders.values():  # warm: the first calls of each shape pay for allocations
        for calls in workloads(encoder, images, 1).values():
            time_calls(encoder, calls[:2])
    for _ in range(rounds):
        for name, encoder in encoders.items():
            for workload, calls in workloads(encoder, images, repeats).items():
                wall, cpu = time_calls(encoder, calls)
                count = sum(len(batch) for batch in calls)
                samples.setdefault((name, workload), []).append((count / wall, cpu * 1e3 / count))
    return [{"configuration": name, "workload": workload,
             "torch_threads": encoders[name].describe().get("torch_threads"),
             "img_per_s": [round(rate, 2) for rate, _ in got], "cpu_ms_per_image": [round(ms, 2) for _, ms in got],
             "img_per_s_median": round(statistics.median(rate for rate, _ in got), 2),
             "cpu_ms_per_image_median": round(statistics.median(ms for _, ms in got), 2)}
            for (name, workload), got in samples.items()]
