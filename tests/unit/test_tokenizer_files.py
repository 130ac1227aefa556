"""`run`'s tokenizer check (serve/plan/model_checks.py `check_tokenizer`): a `tokenizer.json` on this machine is parsed
without torch or open_clip (models/tokenizer_files.py); whatever it cannot tell is loaded as the text replicas load it,
so both give the same verdict and the same one line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from siglip_serve.core.errors import ModelLoadError
from siglip_serve.models.settings import ModelSettings
from siglip_serve.models.text import load_tokenizer
from siglip_serve.models.tokenizer_files import BUNDLED_TINY_TOKENIZER, check_fast_tokenizer
from siglip_serve.serve.plan.model_checks import check_tokenizer
from tests.bounds import scaled
from tests.helpers import small_tokenizer


def test_the_tiny_models_tokenizer_is_checked_without_torch_or_open_clip() -> None:
    code = ("import sys; from siglip_serve.serve.plan.config import ServiceConfig; "
            "from siglip_serve.serve.plan.model_checks import preflight_tokenizer; "
            "print(preflight_tokenizer(ServiceConfig(model='tiny-siglip')), preflight_tokenizer("
            "ServiceConfig(model='tiny-siglip2', text_replicas=1)), "
            "sorted(m for m in ('torch', 'open_clip', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=scaled(120), check=True)
    assert out.stdout.strip() == "None None []"


def test_a_directory_with_its_tokenizer_json_is_parsed_and_a_broken_one_refused_as_the_replicas_refuse_it(
        tmp_path: Path) -> None:
    good = small_tokenizer(tmp_path / "good")
    assert check_fast_tokenizer(ModelSettings(model="tiny-siglip", tokenizer=good), {})
    broken = tmp_path / "broken"
    shutil.copytree(good, broken)
    (broken / "tokenizer.json").write_text("{not json", encoding="utf-8")
    settings = ModelSettings(model="tiny-siglip", tokenizer=broken)
    with pytest.raises(ModelLoadError) as fast:
        check_tokenizer(settings)
    with pytest.raises(ModelLoadError) as replicas:
        load_tokenizer(settings, {})
    said = f"cannot load the tokenizer from {broken}"
    assert str(fast.value).split(" (")[0] == str(replicas.value).split(" (")[0] == said
    with pytest.raises(ModelLoadError, match="tokenizer directory not found"):
        check_tokenizer(ModelSettings(model="tiny-siglip", tokenizer=tmp_path / "absent"))


def test_what_the_fast_check_cannot_tell_is_loaded_the_replicas_way(tmp_path: Path) -> None:
    # open_clip's local-dir: without an HF tokenizer name builds a tokenizer of its own, not from the files
    own = tmp_path / "own"
    shutil.copytree(BUNDLED_TINY_TOKENIZER, own)
    config = json.loads((own / "open_clip_config.json").read_text(encoding="utf-8"))
    del config["model_cfg"]["text_cfg"]["hf_tokenizer_name"]
    (own / "open_clip_config.json").write_text(json.dumps(config), encoding="utf-8")
    assert not check_fast_tokenizer(ModelSettings(model="tiny-siglip", tokenizer=own), {})
    # no tokenizer.json: only transformers can tell whether the other files make a tokenizer
    empty = tmp_path / "empty"
    empty.mkdir()
    settings = ModelSettings(model="tiny-siglip", tokenizer=empty)
    assert not check_fast_tokenizer(settings, {})
    with pytest.raises(ModelLoadError, match=f"cannot load the tokenizer from {empty}"):
        check_tokenizer(settings)


def test_the_models_hf_tokenizer_in_the_hub_cache_is_parsed_there(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    snapshot = tmp_path / "hub" / "models--org--tok" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    shutil.copy(small_tokenizer(tmp_path / "tok") / "tokenizer.json", snapshot / "tokenizer.json")
    (tmp_path / "hub" / "models--org--tok" / "refs").mkdir()
    (tmp_path / "hub" / "models--org--tok" / "refs" / "main").write_text("a" * 40, encoding="utf-8")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    settings = ModelSettings(model="ViT-B-16-SigLIP", random_weights=True)
    assert check_fast_tokenizer(settings, {"hf_tokenizer_name": "org/tok"})
    assert not check_fast_tokenizer(settings, {"hf_tokenizer_name": "org/elsewhere"})  # not cached: the replicas' way
