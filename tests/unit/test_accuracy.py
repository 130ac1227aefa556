"""`siglip-serve accuracy` on the CPU: same weights agree, different weights fail the bar."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from siglip_serve.__main__ import main as siglip_serve
from siglip_serve.core.cli import SettingsError
from siglip_serve.measure.accuracy import compare_embeddings, parse_spec


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory: pytest.TempPathFactory, photo_jpegs: list[bytes]) -> Path:
    folder = tmp_path_factory.mktemp("images")
    for i, data in enumerate(photo_jpegs):
        (folder / f"photo{i}.jpg").write_bytes(data)
    (folder / "broken.jpg").write_bytes(b"\xff\xd8\xff not really a jpeg")
    (folder / "notes.txt").write_text("not an image, not even looked at")
    return folder


def run(image_folder: Path, tmp_path: Path, b_spec: str) -> tuple[int, dict]:
    out = tmp_path / "accuracy.json"
    code = siglip_serve(["accuracy", "--model", "tiny-siglip", "--a", "backend=cpu,torch_threads=1",
                         "--b", b_spec, "--images", str(image_folder), "--json", str(out), "--log-level", "ERROR"])
    return code, json.loads(out.read_text())


def test_same_weights_agree(image_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, result = run(image_folder, tmp_path, "backend=cpu,torch_threads=1,buckets=1,2,4")
    assert code == 0 and result["passed"]
    assert result["images"] == 5 and [Path(p).name for p in result["rejected_images"]] == ["broken.jpg"]
    assert result["cosine_min"] >= 0.99999 and result["cosine_mean"] >= 0.99999
    assert result["mae"] < 1e-6 and result["max_abs_error"] < 1e-5
    assert result["threshold"] == 0.999 and result["gate"] == "cosine_min"
    report = capsys.readouterr().out
    for label in ("cosine min", "cosine mean", "MAE", "max abs error", "PASS"):
        assert label in report


def test_different_weights_fail_the_threshold(image_folder: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    code, result = run(image_folder, tmp_path, "backend=cpu,torch_threads=1,seed=1")
    assert code == 1 and not result["passed"]
    assert result["cosine_min"] < 0.999 and result["b"]["weights"] == "random(seed=1)"
    assert "FAIL" in capsys.readouterr().out


def test_bad_spec_is_a_usage_error(image_folder: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert siglip_serve(["accuracy", "--a", "backend=cpu", "--b", "colour=blue", "--images", str(image_folder)]) == 2
    assert "colour" in caplog.text


def test_spec_parsing() -> None:
    settings = parse_spec("backend=cpu, buckets=1,2,4 ,model=tiny-siglip,random-weights=true")
    assert settings.buckets == (1, 2, 4) and settings.model == "tiny-siglip" and settings.random_weights
    assert parse_spec("seed=3", {"model": "tiny-siglip"}).model == "tiny-siglip"
    assert parse_spec("backend=neuron,artifact_dir=~/a", {}).artifact_dir == Path("~/a").expanduser()
    with pytest.raises(SettingsError, match="not key=value"):
        parse_spec("cpu")
    with pytest.raises(SettingsError, match="backend"):
        parse_spec("backend=tpu")


def test_compare_embeddings_statistics() -> None:
    a = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    same = compare_embeddings(a, a.copy())
    assert same["cosine_min"] == pytest.approx(1.0) and same["mae"] == 0 and same["max_abs_error"] == 0
    b = np.array([[1.0, 0.0], [0.6, 0.8]], dtype=np.float32)
    diff = compare_embeddings(a, b)
    assert diff["cosine_min"] == pytest.approx(0.8) and diff["cosine_mean"] == pytest.approx(0.9)
    assert diff["mae"] == pytest.approx(0.2) and diff["max_abs_error"] == pytest.approx(0.6)
    assert diff["worst_index"] == 1
    with pytest.raises(ValueError, match="shape"):
        compare_embeddings(a, b[:1])
