"""`replicas: auto` on cpu counts the model's parameters once (models/loading.py, a meta-device build) and keeps them
(models/parameter_cache.py): a later plan reads them without torch or open_clip; a changed builder or a broken file
is counted again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from siglip_serve.models import parameter_cache
from siglip_serve.models.loading import parameter_counts as counted
from siglip_serve.models.parameter_cache import ParameterCounts, cache_key, cache_path, cached, keep
from siglip_serve.models.source import model_source
from siglip_serve.serve.plan import cpu_plan
from tests.bounds import scaled


def test_counts_are_kept_once_counted_and_read_back_without_torch(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cached("tiny-siglip") is None
    counts = cpu_plan.parameter_counts(model_source("tiny-siglip"))
    assert counts == counted(model_source("tiny-siglip")) and cache_path().parent == tmp_path / "siglip-serve"
    assert cached("tiny-siglip") == counts
    code = ("import sys; from siglip_serve.serve.plan.cpu_plan import parameter_counts; "
            "from siglip_serve.models.source import model_source; "
            "c = parameter_counts(model_source('tiny-siglip')); print(c.image, c.total, "
            "sorted(m for m in ('torch', 'open_clip') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=scaled(120),
                         check=True, env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)})
    assert out.stdout.strip() == f"{counts.image} {counts.total} []"


def test_another_builder_a_broken_file_or_no_config_file_is_counted_again(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    keep("tiny-siglip", ParameterCounts(image=1, total=2))
    assert cached("tiny-siglip") == ParameterCounts(image=1, total=2)
    key = cache_key("tiny-siglip")
    assert key is not None and "timm " in key and "open_clip_torch " in key
    monkeypatch.setattr(parameter_cache, "BUILDERS", ("open_clip_torch", "timm", "siglip-serve", "torch"))
    assert cached("tiny-siglip") is None  # a builder more: another key
    monkeypatch.undo()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache_path().write_text("{half", encoding="utf-8")
    assert cached("tiny-siglip") is None
    cache_path().write_text(json.dumps({key: {"image": "many"}}), encoding="utf-8")
    assert cached("tiny-siglip") is None
    assert cache_key("a-config-registered-at-run-time") is None
    assert cache_key("hf-hub:org/name") is None and cache_key("org/name") is None  # hub models: counted each time
    # a cache directory that cannot be written: counted around, never an error
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a-file"))
    (tmp_path / "a-file").write_text("", encoding="utf-8")
    keep("tiny-siglip", ParameterCounts(image=1, total=2))
    assert cached("tiny-siglip") is None
