"""`siglip-serve compile --dry-run` for both Neuron lines at LNC 1 and 2: the plan, with no SDK
installed and nothing written. (The trace line's own options are covered in test_neuron_compile.py.)
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from siglip_serve.__main__ import main
from tests.helpers import neuron_env, torch_neuronx_from

RECIPE = "--auto-cast=matmult --auto-cast-type=bf16 --model-type transformer"


def dry_run(capsys: pytest.CaptureFixture[str], tmp_path: Path, *args: str) -> dict:
    before = neuron_env()
    with torch_neuronx_from(None):
        code = main(["compile", *args, "--buckets", "1,2,4", "--cache-root", str(tmp_path), "--dry-run",
                     "--log-level", "ERROR"])
    assert code == 0
    assert neuron_env() == before, "a dry run sets no environment"
    assert not any(tmp_path.iterdir()), "a dry run writes nothing"
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("backend", ["neuron", "neuron-native"])
def test_siglip2_plans_on_both_lines(backend: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """SigLIP 2's image tower is SigLIP's ViT: both lines plan it as they plan SigLIP (the 15 open_clip
    SigLIP 2 configs were planned the same way by hand: docs/trn2.md)."""
    plan = dry_run(capsys, tmp_path, "--backend", backend, "--model", "tiny-siglip2", "--lnc", "2")
    assert plan["model"] == "tiny-siglip2" and plan["lnc"] == 2
    assert re.fullmatch(r"tiny-siglip2-lnc2-[0-9a-f]{12}", Path(plan["artifact_dir"]).name)
    assert [b["batch"] for b in plan["buckets"]] == [1, 2, 4]


@pytest.mark.parametrize("lnc", [1, 2])
def test_trace_line_plan(lnc: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = dry_run(capsys, tmp_path, "--backend", "neuron", "--model", "tiny-siglip", "--lnc", str(lnc))
    assert plan["lnc"] == lnc and plan["versions"]["torch_neuronx"] is None
    assert re.fullmatch(rf"tiny-siglip-lnc{lnc}-[0-9a-f]{{12}}", Path(plan["artifact_dir"]).name)
    assert [b["batch"] for b in plan["buckets"]] == [1, 2, 4]
    args = plan["buckets"][0]["compiler_args"]
    assert args[args.index("--lnc") + 1] == str(lnc) and args[args.index("--auto-cast") + 1] == "matmult"


@pytest.mark.parametrize("lnc", [1, 2])
def test_native_line_plan(lnc: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = dry_run(capsys, tmp_path, "--backend", "neuron-native", "--model", "tiny-siglip", "--lnc", str(lnc))
    assert plan["line"] == "neuron-native" and plan["lnc"] == lnc
    assert plan["requires"] == {"torch_neuronx": "2.14.3.0.*", "torch": "2.14.*", "neuronx_cc": "2.28.7631.0"}
    assert plan["versions"]["torch_neuronx"] is None  # no SDK here: the plan says so
    # The cache directory is named by the SDK; the artifact by model, LNC and key.
    assert Path(plan["sdk_dir"]) == tmp_path / "torchneuron-none-ccnone"
    artifact = Path(plan["artifact_dir"])
    assert artifact.parent == Path(plan["sdk_dir"])
    assert re.fullmatch(rf"tiny-siglip-lnc{lnc}-[0-9a-f]{{12}}", artifact.name)
    assert re.fullmatch(r"[0-9a-f]{64}", plan["weights"]["sha256"])  # random weights, hashed on the CPU
    # Seed 000's recipe, as TorchNeuron's environment.
    assert plan["env"] == {
        "NEURON_LOGICAL_NC_CONFIG": str(lnc),
        "NEURON_CC_FLAGS": f"--target trn2 --lnc {lnc} {RECIPE}",
        "NEURON_COMPILER_OPT_LEVEL": "-O3",
        "TORCH_NEURONX_NEFF_CACHE_DIR": str(artifact.resolve() / "neff"),
    }
    assert [(b["batch"], b["input_shape"], b["input_dtype"]) for b in plan["buckets"]] == [
        (1, [1, 3, 64, 64], "uint8"), (2, [2, 3, 64, 64], "uint8"), (4, [4, 3, 64, 64], "uint8")]
    assert all("fullgraph=True, dynamic=False" in b["compile"] for b in plan["buckets"])


def test_native_plan_reads_no_weights(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A pretrained model: the dry run neither downloads nor hashes it, so the key is left open.
    plan = dry_run(capsys, tmp_path, "--backend", "neuron-native", "--model", "ViT-B-16-SigLIP", "--lnc", "1",
                   "--optlevel", "2", "--auto-cast", "none")
    assert plan["weights"] == {"source": "pretrained:webli", "sha256": None}
    assert plan["artifact_dir"] is None and plan["cache_key"] is None
    assert plan["env"]["NEURON_CC_FLAGS"] == "--target trn2 --lnc 1 --auto-cast=none --model-type transformer"
    assert plan["env"]["NEURON_COMPILER_OPT_LEVEL"] == "-O2"
    assert plan["buckets"][0]["input_shape"] == [1, 3, 224, 224]


def test_native_lnc_defaults_to_the_runtimes(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")
    assert dry_run(capsys, tmp_path, "--backend", "neuron-native", "--model", "tiny-siglip")["lnc"] == 1
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "3")
    assert main(["compile", "--backend", "neuron-native", "--model", "tiny-siglip", "--dry-run",
                 "--cache-root", str(tmp_path), "--log-level", "ERROR"]) == 2


def test_native_text_plan_one_int64_graph_per_text_bucket(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ("--backend", "neuron-native", "--model", "tiny-siglip", "--lnc", "2")
    plan = dry_run(capsys, tmp_path, *base, "--text", "--text-buckets", "1,4")
    assert [(b["batch"], b["input_shape"], b["input_dtype"]) for b in plan["text_buckets"]] == [
        (1, [1, 16], "int64"), (4, [4, 16], "int64")]  # tiny-siglip's fixed context length
    assert all("fullgraph=True, dynamic=False" in b["compile"] for b in plan["text_buckets"])
    image_only = dry_run(capsys, tmp_path, *base)
    assert image_only["text_buckets"] == [] and image_only["cache_key"] != plan["cache_key"]
