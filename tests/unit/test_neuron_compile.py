"""`siglip-serve compile`: plan, manifest, artifact reuse and invalidation, against the trace double.

What the double does not prove (no neuronx-cc, no NEFF, no bf16 numerics, no NeuronCore) is said
in tests/doubles/torch_neuronx; tests/device/test_neuron_trn2.py does that on a trn2.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
import torch

from siglip_serve.models.loading import load_embedder
from siglip_serve.models.neuron.manifest import MANIFEST_NAME, is_complete, read_manifest
from siglip_serve.models.neuron.sdk import sdk_versions
from siglip_serve.models.neuron.trace import CompileOptions, compile_artifact, main, make_plan, point_link
from tests.helpers import neuronx_double, tiny_settings, torch_neuronx_from

SEED_ARGS = ["--optlevel", "3", "--model-type", "transformer", "--verbose", "error"]


def expected_args(lnc: int, auto_cast: str) -> list[str]:
    cast = ["--auto-cast", auto_cast] + (["--auto-cast-type", "bf16"] if auto_cast != "none" else [])
    return ["--target", "trn2", "--lnc", str(lnc), *cast, *SEED_ARGS]


def test_default_compiler_args_are_seed_000s_recipe() -> None:
    assert CompileOptions().compiler_args() == expected_args(2, "matmult")
    assert CompileOptions(lnc=1, auto_cast="none").compiler_args() == expected_args(1, "none")
    custom = CompileOptions(optlevel=2, verbose=None, extra_args=("--enable-fast-loading-neuron-binaries",))
    assert custom.compiler_args()[-1] == "--enable-fast-loading-neuron-binaries"
    assert "--verbose" not in custom.compiler_args() and custom.compiler_args()[8:10] == ["--optlevel", "2"]
    with pytest.raises(ValueError, match="1 or 2"):
        CompileOptions(lnc=4)


@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("auto_cast", ["matmult", "none"])
def test_dry_run_prints_the_plan_without_the_sdk(lnc: int, auto_cast: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with torch_neuronx_from(None):
        code = main(["--model", "tiny-siglip", "--buckets", "1,2,4", "--lnc", str(lnc), "--auto-cast", auto_cast,
                     "--compiler-arg=--enable-fast-loading-neuron-binaries", "--extra-args", "--foo 1",
                     "--cache-root", str(tmp_path), "--dry-run", "--log-level", "ERROR"])
    assert code == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["lnc"] == lnc and plan["auto_cast"] == auto_cast
    assert plan["auto_cast_type"] == (None if auto_cast == "none" else "bf16")
    assert plan["versions"]["torch_neuronx"] is None  # no SDK here: the plan says so
    directory = Path(plan["artifact_dir"])
    assert directory.parent == tmp_path and re.fullmatch(rf"tiny-siglip-lnc{lnc}-[0-9a-f]{{12}}", directory.name)
    assert [b["batch"] for b in plan["buckets"]] == [1, 2, 4]
    for entry in plan["buckets"]:
        assert entry["input_shape"] == [entry["batch"], 3, 64, 64] and entry["input_dtype"] == "uint8"
        assert entry["compiler_args"] == expected_args(lnc, auto_cast) + [
            "--enable-fast-loading-neuron-binaries", "--foo", "1"]
        assert entry["artifact"] == str(directory / f"bucket-{entry['batch']}.pt")
    assert not directory.exists()  # a dry run writes nothing


@pytest.mark.parametrize("lnc,auto_cast", [(1, "matmult"), (2, "matmult"), (1, "none"), (2, "none")])
def test_compile_writes_one_torchscript_per_bucket_and_a_manifest(lnc: int, auto_cast: str, tmp_path: Path) -> None:
    settings = tiny_settings()
    with neuronx_double() as double:
        result = compile_artifact(settings, CompileOptions(lnc=lnc, auto_cast=auto_cast), tmp_path)
        calls = list(double.CALLS)
    assert not result.reused
    manifest = json.loads((result.artifact_dir / MANIFEST_NAME).read_text())
    args = expected_args(lnc, auto_cast)
    assert manifest["model"] == "tiny-siglip"
    assert manifest["weights"]["source"] == "random(seed=0)"
    assert re.fullmatch(r"[0-9a-f]{64}", manifest["weights"]["sha256"])
    assert "seeded random weights" in manifest["weights"]["sha256_of"]
    assert manifest["image_size"] == [64, 64] and manifest["embed_dim"] == 64 and manifest["buckets"] == [1, 2]
    assert manifest["lnc"] == lnc and manifest["auto_cast"] == auto_cast and manifest["compiler_args"] == args
    assert manifest["auto_cast_type"] == (None if auto_cast == "none" else "bf16")
    assert manifest["versions"]["torch"] == torch.__version__
    assert manifest["versions"]["torch_neuronx"] == "0.0.0+test-double"
    assert "neuronx_cc" in manifest["versions"]
    assert datetime.fromisoformat(manifest["created_at"]).tzinfo is not None
    assert set(manifest["compile_seconds"]) == {"1", "2"}
    assert result.artifact_dir.name.endswith(manifest["cache_key"][:12])
    # trace ran once per bucket, with that bucket's uint8 example, exactly these arguments, and the
    # runtime LNC set to the compiled one as seed 000 does.
    assert [(c["input_shape"], c["input_dtype"]) for c in calls] == [([1, 3, 64, 64], "torch.uint8"),
                                                                    ([2, 3, 64, 64], "torch.uint8")]
    assert all(c["compiler_args"] == args and c["lnc_env"] == str(lnc) for c in calls)
    assert sorted(p.name for p in result.artifact_dir.iterdir()) == ["bucket-1.pt", "bucket-2.pt", MANIFEST_NAME]
    # The saved TorchScript is the model: same embeddings as the eager CPU embedder.
    embedder, _ = load_embedder(settings)
    images = torch.randint(0, 256, (2, 3, 64, 64), dtype=torch.uint8)
    loaded = torch.jit.load(str(result.artifact_dir / "bucket-2.pt"))
    with torch.inference_mode():
        np.testing.assert_allclose(loaded(images).numpy(), embedder(images).numpy(), atol=1e-5)


def test_same_inputs_reuse_the_artifact_without_tracing(tmp_path: Path) -> None:
    settings, options = tiny_settings(buckets=(1,)), CompileOptions()
    with neuronx_double() as double:
        first = compile_artifact(settings, options, tmp_path)
        assert len(double.CALLS) == 1
        second = compile_artifact(settings, options, tmp_path)
        assert len(double.CALLS) == 1, "a second compile with the same inputs must not trace"
        forced = compile_artifact(settings, options, tmp_path, force=True)
        assert len(double.CALLS) == 2
    assert second.reused and second.artifact_dir == first.artifact_dir == forced.artifact_dir
    assert is_complete(forced.artifact_dir)


def test_any_changed_input_makes_a_new_artifact(tmp_path: Path) -> None:
    base, options = tiny_settings(buckets=(1,)), CompileOptions()
    versions = sdk_versions()
    embedder = load_embedder(base)[0]

    def key(settings=base, opts=options, vers=versions) -> str:
        emb = embedder if settings.seed == base.seed else load_embedder(settings)[0]
        return make_plan(settings, opts, tmp_path, vers, emb).artifact_dir.name

    keys = {
        "base": key(),
        "bucket": key(settings=tiny_settings(buckets=(1, 2))),
        "lnc": key(opts=CompileOptions(lnc=1)),
        "auto_cast": key(opts=CompileOptions(auto_cast="none")),
        "auto_cast_type": key(opts=CompileOptions(auto_cast_type="fp16")),
        "extra_arg": key(opts=CompileOptions(extra_args=("--foo",))),
        "weights": key(settings=tiny_settings(buckets=(1,), seed=1)),
        "neuronx_cc": key(vers={**versions, "neuronx_cc": "2.22.12471.0"}),
    }
    assert len(set(keys.values())) == len(keys), keys
    assert key() == keys["base"]  # and the key is stable for the same inputs
    with neuronx_double() as double:
        one = compile_artifact(base, options, tmp_path)
        two = compile_artifact(tiny_settings(buckets=(1, 2)), options, tmp_path)
        assert len(double.CALLS) == 3  # 1 bucket, then 2 more: nothing reused across input sets
    assert one.artifact_dir != two.artifact_dir and is_complete(one.artifact_dir) and is_complete(two.artifact_dir)


def test_checkpoint_weights_are_keyed_by_the_files_sha256(tmp_path: Path) -> None:
    # The plan hashes the file and reads only the model's config: no model is built, so any bytes do.
    # (tiny-siglip always runs random weights, so a real config name stands in here.)
    path = tmp_path / "model.pt"
    path.write_bytes(b"weights v1" * 1000)
    settings = tiny_settings(model="ViT-B-16-SigLIP", checkpoint=path)
    plan = make_plan(settings, CompileOptions(), tmp_path, sdk_versions())
    assert plan.weights.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert plan.weights.sha256_of == "checkpoint file" and plan.weights.source == f"checkpoint:{path}"
    assert plan.artifact_dir.name.startswith("ViT-B-16-SigLIP-lnc2-") and plan.image_size == (224, 224)
    path.write_bytes(b"weights v2" * 1000)
    assert make_plan(settings, CompileOptions(), tmp_path, sdk_versions()).key != plan.key


def test_a_failed_compile_is_never_taken_for_an_artifact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings, options = tiny_settings(), CompileOptions()
    with neuronx_double() as double:
        real_trace = double.trace

        def fail_on_second_bucket(func, example, **kwargs):
            if example.shape[0] == 2:
                raise RuntimeError("neuronx-cc: simulated compiler failure")
            return real_trace(func, example, **kwargs)

        monkeypatch.setattr(double, "trace", fail_on_second_bucket)
        with pytest.raises(RuntimeError, match="simulated"):
            compile_artifact(settings, options, tmp_path)
        final = make_plan(settings, options, tmp_path, sdk_versions(double), load_embedder(settings)[0]).artifact_dir
        assert not final.exists() and not is_complete(final)
        leftovers = [p.name for p in tmp_path.iterdir()]
        assert len(leftovers) == 1 and leftovers[0].startswith(f".{final.name}.partial-")
        monkeypatch.setattr(double, "trace", real_trace)
        result = compile_artifact(settings, options, tmp_path)
    assert result.artifact_dir == final and not result.reused and read_manifest(final).buckets == [1, 2]


def test_link_points_at_the_artifact_and_moves_with_it(tmp_path: Path) -> None:
    with neuronx_double():
        code = main(["--model", "tiny-siglip", "--buckets", "1", "--cache-root", str(tmp_path / "cache"),
                     "--link", str(tmp_path / "so400m-lnc2"), "--log-level", "ERROR"])
        assert code == 0
        first = (tmp_path / "so400m-lnc2").resolve()
        assert main(["--model", "tiny-siglip", "--buckets", "1", "--lnc", "1", "--cache-root", str(tmp_path / "cache"),
                     "--link", str(tmp_path / "so400m-lnc2"), "--log-level", "ERROR"]) == 0
    second = (tmp_path / "so400m-lnc2").resolve()
    assert first != second and read_manifest(second).lnc == 1 and read_manifest(first).lnc == 2
    (tmp_path / "real").mkdir()
    with pytest.raises(Exception, match="not a symlink"):
        point_link(tmp_path / "real", second)


def test_compile_without_the_sdk_fails_with_one_clear_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with torch_neuronx_from(None):
        assert main(["--model", "tiny-siglip", "--cache-root", str(tmp_path), "--log-level", "ERROR"]) == 2
    assert "pip.repos.neuron.amazonaws.com" in caplog.text and not any(tmp_path.iterdir())


@pytest.mark.parametrize("env, expected", [(None, 2), ("1", 1), ("2", 2)])
def test_lnc_defaults_to_the_runtimes(env: str | None, expected: int, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    if env is None:
        monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG", raising=False)
    else:
        monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", env)
    assert main(["--model", "tiny-siglip", "--dry-run", "--cache-root", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out)["lnc"] == expected


def test_invalid_runtime_lnc_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "3")
    assert main(["--model", "tiny-siglip", "--dry-run", "--cache-root", str(tmp_path)]) == 2


def test_trace_runs_under_no_grad_not_inference_mode(tmp_path: Path) -> None:
    """torch_neuronx.trace moves the model to XLA tensors, which fail under inference_mode: the
    compile must trace under no_grad (the double records the mode it was called in)."""
    with neuronx_double() as double:
        compile_artifact(tiny_settings(), CompileOptions(lnc=2), tmp_path)
        calls = list(double.CALLS)
    assert len(calls) == 2
    assert all(c["grad_enabled"] is False and c["inference_mode"] is False for c in calls)
