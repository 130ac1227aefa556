"""deploy/kuberay/artifacts-efs.yaml's populate recipe, run as its header documents it: the tar pipe onto a volume as
an EFS access point presents it, and the replicas' reader accepting what lands (the manifest's other checks:
tests/unit/test_kuberay_manifest.py)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.helpers import REPO

VOLUME_MANIFEST = REPO / "deploy" / "kuberay" / "artifacts-efs.yaml"


def _populate_pipe() -> tuple[str, str]:
    """The header's tar pipe: the local side, and the command `kubectl exec` runs in the populate pod."""
    lines = [line.lstrip("# ").rstrip(" \\") for line in VOLUME_MANIFEST.read_text().splitlines()]
    at = next(i for i, line in enumerate(lines) if line.startswith("tar -C artifacts"))
    remote = lines[at + 1].split("kubectl exec -i siglip-artifacts-populate -- ", 1)[1]
    return lines[at], remote


@pytest.mark.skipif(os.geteuid() != 0, reason="runs tar as other users (setpriv), which needs root")
def test_the_populate_commands_copy_an_artifact_the_replicas_accept(tmp_path: Path) -> None:
    """The header's tar pipe, with the local tar standing in for `kubectl exec`, onto a volume as an EFS access
    point presents it: owned by a uid other than the files', written by a client that may not chown (root without
    CAP_CHOWN, the populate image's user), and by a non-root user. The relative link resolves on the volume and
    the artifact's reader accepts what it points at."""
    import subprocess
    import tempfile

    from siglip_serve.models.backends.artifact_volume import artifact_gaps
    from siglip_serve.models.neuron.manifest import Manifest, file_sizes, read_manifest
    from siglip_serve.models.neuron.trace import point_link

    compiled = tmp_path / "artifacts" / "so400m-lnc2-0123456789ab"
    compiled.mkdir(parents=True)
    (compiled / "bucket-1.pt").write_bytes(b"graph")
    Manifest(model="ViT-SO400M-14-SigLIP-384", weights={}, image_size=[384, 384], embed_dim=1152, buckets=[1], lnc=2,
             versions={}, cache_key="0123456789ab", auto_cast="matmult", auto_cast_type="bf16", target="trn2",
             compiler_args=[], files={"1": "bucket-1.pt"}, sizes=file_sizes(compiled)).write(compiled)
    point_link(tmp_path / "artifacts" / "so400m-lnc2", compiled)
    subprocess.run(["chown", "-hR", "1234:1234", str(tmp_path / "artifacts")], check=True)  # the compiling user
    pack, remote = _populate_pipe()
    assert "--no-same-owner" in remote
    no_chown = "setpriv --inh-caps=-chown --bounding-set=-chown"
    nobody = "setpriv --reuid=65534 --regid=65534 --clear-groups"
    base = Path(tempfile.mkdtemp(prefix="populate-"))  # outside pytest's 0700 root: the other uid must reach it
    try:
        base.chmod(0o755)
        for who, as_user in (("root without CAP_CHOWN", no_chown), ("uid 65534", nobody)):
            volume = base / who.split()[0]
            volume.mkdir()
            os.chown(volume, 65534, 65534)  # the access point's uid, not the files' 1234
            if as_user == no_chown:  # without the flag, root's tar tries each chown and exits 2
                refused = subprocess.run(f"{pack} | {as_user} {remote.replace(' --no-same-owner', '')}".replace(
                    "/artifacts", str(volume)), shell=True, cwd=tmp_path, capture_output=True, text=True)
                assert refused.returncode == 2 and "Cannot change ownership" in refused.stderr, refused.stderr
            done = subprocess.run(f"{pack} | {as_user} {remote}".replace("/artifacts", str(volume)), shell=True,
                                  cwd=tmp_path, capture_output=True, text=True)
            assert done.returncode == 0, (who, done.stderr)
            link = volume / "so400m-lnc2"
            assert link.is_symlink() and not Path(os.readlink(link)).is_absolute(), who
            assert read_manifest(link.resolve()).cache_key == "0123456789ab", who
            assert artifact_gaps(link.resolve()) is None, who
    finally:
        shutil.rmtree(base)
