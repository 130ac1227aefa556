"""Under KubeRay a missing, empty or incomplete artifact is the volume's fault, said so
(models/backends/artifact_volume.py), and a served replica waits for the volume rather than failing
(serve/towers/replica_start.py)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from pathlib import Path

import pytest

from siglip_serve.core.constants import KUBERAY_ENV
from siglip_serve.models.backends.compiled import checked_artifact, volume_refusal
from siglip_serve.models.neuron.manifest import ArtifactError, read_manifest
from siglip_serve.serve.towers import replica_start
from tests.helpers import tiny_settings


def test_only_under_kuberay_is_a_missing_or_empty_artifact_the_volumes_fault(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing, empty, filled = tmp_path / "missing", tmp_path / "empty", tmp_path / "filled"
    empty.mkdir()
    filled.mkdir()
    (filled / "manifest.json").write_text("{}")
    for name in KUBERAY_ENV:
        monkeypatch.delenv(name, raising=False)
    assert [volume_refusal(p) for p in (missing, empty, filled)] == [None, None, None]
    with pytest.raises(ArtifactError, match="build it with `siglip-serve compile`"):
        checked_artifact(tiny_settings(artifact_dir=missing), "neuron", "siglip-serve compile", read_manifest,
                         ArtifactError)
    monkeypatch.setenv("RAY_CLUSTER_NAME", "siglip-serve")  # either of KubeRay's variables
    told = str(volume_refusal(missing))
    assert f"{missing} does not exist on this pod: mount or populate the artifact volume" in told
    assert f"{empty} is empty on this pod" in str(volume_refusal(empty))
    assert volume_refusal(filled) is None
    with pytest.raises(ArtifactError) as refused:
        checked_artifact(tiny_settings(artifact_dir=empty), "neuron", "siglip-serve compile", read_manifest,
                         ArtifactError)
    assert "mount or populate the artifact volume on this pod" in str(refused.value)
    assert "compile" not in str(refused.value).replace("deploy/kuberay", "")


def test_an_artifact_is_whole_only_with_every_file_its_manifest_lists_at_its_size(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_CLUSTER_NAME", "siglip-serve")
    artifact = tmp_path / "so400m-lnc2-abc"
    artifact.mkdir()
    (artifact / "bucket-1.pt").write_bytes(b"x" * 10)
    assert "no manifest.json yet" in str(volume_refusal(artifact))
    (artifact / "manifest.json").write_text('{"files": {"1": "bucket-1.pt", "2": "bucket-2.pt"}')
    assert "manifest.json is not whole JSON yet" in str(volume_refusal(artifact))
    manifest = {"files": {"1": "bucket-1.pt", "2": "bucket-2.pt"}, "sizes": {"bucket-1.pt": 10, "bucket-2.pt": 20}}
    (artifact / "manifest.json").write_text(json.dumps(manifest))
    told = str(volume_refusal(artifact))
    assert f"artifact directory {artifact} is incomplete on this pod (1 of the 2 files its manifest lists missing " \
           "(first bucket-2.pt)): finish populating the artifact volume" in told, told
    (artifact / "bucket-2.pt").write_bytes(b"x" * 5)  # still arriving
    assert "1 not yet at the size or sha256 it records (first bucket-2.pt)" in str(volume_refusal(artifact))
    (artifact / "bucket-2.pt").write_bytes(b"x" * 20)
    assert volume_refusal(artifact) is None
    # TorchNeuron's older manifests record no sizes: its graphs must be there, its weights file at its sha256.
    native = tmp_path / "native"
    (native / "neff" / "a").mkdir(parents=True)
    (native / "neff" / "a" / "g.neff").write_bytes(b"g")
    (native / "weights.pt").write_bytes(b"half")
    (native / "manifest.json").write_text(json.dumps({
        "weights_file": "weights.pt", "weights_file_sha256": hashlib.sha256(b"whole").hexdigest(),
        "graphs": {"1": ["a/g.neff"], "2": ["a/h.neff"]}}))
    assert "missing (first neff/a/h.neff)" in str(volume_refusal(native))
    (native / "neff" / "a" / "h.neff").write_bytes(b"h")
    assert "not yet at the size or sha256 it records (first weights.pt)" in str(volume_refusal(native))
    (native / "weights.pt").write_bytes(b"whole")
    assert volume_refusal(native) is None


def test_a_replica_waits_for_a_whole_artifact_and_says_why_every_minute(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in KUBERAY_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KUBERAY_GEN_RAY_START_CMD", "ray start --block")
    monkeypatch.setattr(replica_start, "VOLUME_POLL_S", 0.02)
    monkeypatch.setattr(replica_start, "VOLUME_LOG_S", 0.1)
    artifact = tmp_path / "so400m-lnc2"
    artifact.mkdir()
    (artifact / "manifest.json").write_text(json.dumps({"files": {"1": "bucket-1.pt"}}))
    settings = tiny_settings(artifact_dir=artifact, backend="neuron")
    told: list[str] = []
    filler = threading.Timer(0.5, lambda: (artifact / "bucket-1.pt").write_bytes(b"x"))
    filler.start()
    try:
        asyncio.run(replica_start.wait_for_artifact("image encoder replica", settings, told.append))
    finally:
        filler.cancel()
    assert (artifact / "bucket-1.pt").is_file()
    assert len(told) >= 2 and all("waiting: artifact directory" in m and "is incomplete on this pod" in m
                                  for m in told), told
    # Outside KubeRay, or for a backend that reads no artifact, it does not wait at all.
    monkeypatch.delenv("KUBERAY_GEN_RAY_START_CMD")
    asyncio.run(replica_start.wait_for_artifact("image encoder replica", tiny_settings(artifact_dir=tmp_path / "gone",
                                                                                        backend="neuron"), told.append))
    # A refusal the volume cannot fix, or any refusal outside the served wait, fails at once.
    with pytest.raises(replica_start.ReplicaRefused, match="compile"):
        replica_start.start_tower("image encoder replica", tiny_settings(artifact_dir=tmp_path / "gone",
                                                                         backend="neuron"),
                                  lambda: read_manifest(tmp_path / "gone"))
