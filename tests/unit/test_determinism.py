"""Reproducible vectors on CPU (docs/reproducibility.md): with `deterministic: true` a photo's vector is the same
bit for bit alone, at every position of every batch bucket, on a second replica, from the embedding cache, from
bulk's stages and from every input form; `siglip-serve determinism` (determinism/) measures each of them
with the service's own pieces, and the test holds its answer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from siglip_serve.determinism import cli
from siglip_serve.determinism.comparisons import alone, pixels, sample_files
from siglip_serve.models.backends.implementation import create_encoder
from siglip_serve.models.settings import ModelSettings

TINY = ModelSettings(model="tiny-siglip")


@pytest.fixture(scope="module")
def deterministic_encoder():
    return create_encoder(TINY.model_copy(update={"deterministic": True, "torch_threads": 1}))


def test_deterministic_runs_one_torch_thread_and_refuses_more() -> None:
    assert ModelSettings(model="tiny-siglip", deterministic=True).torch_threads == 1
    assert ModelSettings(model="tiny-siglip", deterministic=True, torch_threads=1).torch_threads == 1
    with pytest.raises(ValidationError, match="one torch thread"):
        ModelSettings(model="tiny-siglip", deterministic=True, torch_threads=2)
    assert ModelSettings(model="tiny-siglip").torch_threads is None  # off: the plan's split, as before
    # Per model: a models: entry that says it sets its own thread too, over the service's.
    from siglip_serve.serve.plan.model_entry import ModelEntry

    assert ModelEntry(name="exact", deterministic=True).own() == {"deterministic": True, "torch_threads": 1}


def test_a_deterministic_tower_runs_every_chunk_at_the_largest_bucket(deterministic_encoder) -> None:
    encoder = deterministic_encoder
    images = pixels(encoder, list(sample_files().values()))
    assert encoder.deterministic and encoder.describe()["deterministic"] is True
    before = dict(encoder.forward_counts)
    reference = alone(encoder, images)
    for size in (2, 5, 8, 11):  # under, at and over the largest bucket
        order = [i % len(images) for i in range(3, 3 + size)]
        assert np.array_equal(encoder.encode(images[order]), reference[order]), size
    runs = {b: encoder.forward_counts[b] - before.get(b, 0) for b in encoder.forward_counts}
    assert set(b for b, count in runs.items() if count) == {encoder.max_batch_size}


def test_every_comparison_is_bit_equal_when_deterministic(tmp_path: Path) -> None:
    out = tmp_path / "determinism.json"
    code = cli.main(["--model", "tiny-siglip", "--configurations", "deterministic", "--require-bit-equal",
                     "--json", str(out), "--log-level", "WARNING"])
    result = json.loads(out.read_text())
    deterministic = result["comparisons"]["deterministic"]
    assert code == 0 and cli.not_bit_equal(result) == []
    compared = {entry["comparison"] for entry in deterministic}
    # Every route the contract promises the same vector on: each bucket, a second replica, the cache, bulk, forms.
    assert {"alone vs batch of 8", "replica A vs replica B", "fresh (alone) vs cache hit", "served (alone) vs bulk",
            "raw vs multipart", "raw vs base64-json", "raw vs url", "int8: alone vs batch of 8",
            "text: alone vs batch of 32"} <= compared
    assert all(entry["bit_equal"] and entry["max_abs_diff"] == 0.0 for entry in deterministic)
    assert result["configurations"] == {"deterministic": {"deterministic": True, "torch_threads": 1}}
    assert result["cost"] == []  # timed only when asked


def test_the_cost_part_times_both_configurations_alternating(deterministic_encoder) -> None:
    from siglip_serve.determinism.cost import measure_cost

    configured = create_encoder(TINY.model_copy(update={"torch_threads": 1}))
    images = pixels(configured, list(sample_files().values()))
    rows = measure_cost({"configured": configured, "deterministic": deterministic_encoder}, images, rounds=2,
                        repeats=1)
    assert {(r["configuration"], r["workload"]) for r in rows} == {
        (c, w) for c in ("configured", "deterministic") for w in ("single", "batch of 8")}
    assert all(len(r["img_per_s"]) == 2 and r["img_per_s_median"] > 0 and r["cpu_ms_per_image_median"] > 0
               for r in rows)


def test_the_served_replicas_build_deterministic_towers_from_the_plan() -> None:
    """What a Serve replica builds (serve/towers/tower_replica.py build_tower) from a config that says
    deterministic: both towers pad to their largest bucket, on one torch thread."""
    from siglip_serve.serve.plan.config import ServiceConfig
    from siglip_serve.serve.plan.planner import plan_service
    from siglip_serve.serve.towers.tower_replica import build_tower

    model = plan_service(ServiceConfig.from_args({"model": "tiny-siglip", "deterministic": True})).model
    assert model.text is not None
    # The text tower first: an image replica's build leaves transformers out of a process that has not imported
    # open_clip yet (models/image_only.py), which the text tower's tokenizer needs.
    for name in ("text", "image"):
        tower, _ = build_tower(model.run, model.towers[name], name)
        assert tower.deterministic and tower.describe()["torch_threads"] == 1, name
