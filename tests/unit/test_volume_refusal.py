"""Under KubeRay a missing or empty artifact is the volume's fault, said so (models/backends/compiled.py), and a
served replica waits for the volume rather than failing (serve/towers/replica_start.py)."""

from __future__ import annotations

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


def test_a_replica_waits_for_the_volume_and_tells_it_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in KUBERAY_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KUBERAY_GEN_RAY_START_CMD", "ray start --block")
    monkeypatch.setattr(replica_start, "VOLUME_POLL_S", 0.05)
    artifact = tmp_path / "so400m-lnc2"
    settings = tiny_settings(artifact_dir=artifact, backend="neuron")
    told: list[str] = []
    tries = 0

    def build() -> str:  # the backend's own check, as create_encoder makes it
        nonlocal tries
        tries += 1
        if (message := volume_refusal(artifact)) is not None:
            raise ArtifactError(message)
        return "tower"

    filler = threading.Timer(0.5, lambda: (artifact.mkdir(), (artifact / "manifest.json").write_text("{}")))
    filler.start()
    try:
        assert replica_start.start_tower("image encoder replica", settings, build, on_refusal=told.append,
                                         wait_for_volume=True) == "tower"
    finally:
        filler.cancel()
    assert tries >= 2 and len(told) == 1 and "mount or populate the artifact volume" in told[0], told
    # A bulk actor (no wait), a backend that reads no artifact, and a refusal the volume cannot fix fail at once.
    gone = tiny_settings(artifact_dir=tmp_path / "gone", backend="neuron")
    with pytest.raises(replica_start.ReplicaRefused, match="artifact volume"):
        replica_start.start_tower("bulk image encoder", gone, lambda: build_gone(tmp_path / "gone"))
    with pytest.raises(replica_start.ReplicaRefused, match="artifact volume"):
        replica_start.start_tower("image encoder replica", tiny_settings(artifact_dir=tmp_path / "gone"),
                                  lambda: build_gone(tmp_path / "gone"), wait_for_volume=True)
    monkeypatch.delenv("KUBERAY_GEN_RAY_START_CMD")
    with pytest.raises(replica_start.ReplicaRefused, match="compile"):
        replica_start.start_tower("image encoder replica", gone, lambda: read_manifest(tmp_path / "gone"),
                                  wait_for_volume=True)


def build_gone(path: Path) -> str:
    raise ArtifactError(str(volume_refusal(path)))
