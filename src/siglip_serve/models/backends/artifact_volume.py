"""An artifact on a pod's volume, under KubeRay: there and whole, or what is still missing and what to do.

Under KubeRay (core/constants.py KUBERAY_ENV, set in every Ray container it creates) a pod's artifact
comes from a volume someone fills: compiling on one pod would reach none of the others. A fill is not
atomic. The documented one (deploy/kuberay/artifacts-efs.yaml) lands the directory before the link that
names it, but `cp -r` or `aws s3 sync` straight into the linked name, DataSync or an interrupted `kubectl
cp` leave a directory that exists and is not yet whole. So a directory counts as there only once its
manifest parses and every file the manifest lists is present, at the size it records (`sizes`, in
artifacts compiled since it was added) or, for a TorchNeuron weights file of an older artifact, with
the sha256 it records. Until then a served replica waits for it (serve/towers/replica_start.py).

Nothing here imports torch: a replica looks before its backend's environment is set.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from siglip_serve.core.constants import KUBERAY_ENV
from siglip_serve.models.neuron.env import NEFF_DIR
from siglip_serve.models.neuron.manifest import MANIFEST_NAME, sha256_file

VOLUME_DOC = "deploy/kuberay/artifacts-efs.yaml, docs/trn2.md \"The artifact volume on Kubernetes\""

# (path, size, mtime_ns) -> sha256, so a replica waiting on a whole-sized weights file hashes it once.
_HASHED: dict[tuple[str, int, int], str] = {}


def _listed(data: dict[str, Any]) -> dict[str, int | None]:
    """Every file either line's manifest lists, relative to the artifact, with its recorded size if any."""
    text = data.get("text") or {}
    names = [*(data.get("files") or {}).values(), *(text.get("files") or {}).values()]
    names += [name for name in (data.get("weights_file"), text.get("weights_file")) if name]
    for graphs in (data.get("graphs") or {}, text.get("graphs") or {}):
        names += [f"{NEFF_DIR}/{graph}" for files in graphs.values() for graph in files]
    sizes = {str(name): int(size) for name, size in (data.get("sizes") or {}).items()}
    return {**dict.fromkeys(map(str, names)), **sizes}


def _hash_differs(path: Path, sha256: str) -> bool:
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _HASHED:
        _HASHED[key] = sha256_file(path)
    return _HASHED[key] != sha256


def artifact_gaps(directory: Path) -> str | None:
    """What `directory` still lacks to be the artifact its manifest describes, or None when it is whole."""
    path = directory / MANIFEST_NAME
    if not path.is_file():
        return f"no {MANIFEST_NAME} yet"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return f"{MANIFEST_NAME} is not whole JSON yet"
    if not isinstance(data, dict):
        return f"{MANIFEST_NAME} is not a manifest"
    listed = _listed(data)
    absent = sorted(name for name in listed if not (directory / name).is_file())
    short = sorted(name for name, size in listed.items()
                   if size is not None and name not in absent and (directory / name).stat().st_size != size)
    if not absent and not short:
        hashed = {data.get("weights_file"): data.get("weights_file_sha256"),
                  (data.get("text") or {}).get("weights_file"): (data.get("text") or {}).get("weights_file_sha256")}
        short = sorted(str(name) for name, sha in hashed.items()
                       if name and sha and listed.get(name) is None and _hash_differs(directory / name, sha))
    if not absent and not short:
        return None
    said = []
    if absent:
        said.append(f"{len(absent)} of the {len(listed)} files its manifest lists missing (first {absent[0]})")
    if short:
        said.append(f"{len(short)} not yet at the size or sha256 it records (first {short[0]})")
    return "; ".join(said)


def volume_refusal(directory: Path) -> str | None:
    """Under KubeRay, what is wrong with a missing, empty or incomplete artifact directory and what to do."""
    if not any(name in os.environ for name in KUBERAY_ENV):
        return None
    if not directory.is_dir() or not any(directory.iterdir()):
        state = "is empty" if directory.is_dir() else "does not exist"
        return (f"artifact directory {directory} {state} on this pod: mount or populate the artifact volume on "
                f"this pod ({VOLUME_DOC}); a served replica waits for it and starts once it is there")
    if (gaps := artifact_gaps(directory)) is None:
        return None
    return (f"artifact directory {directory} is incomplete on this pod ({gaps}): finish populating the artifact "
            f"volume ({VOLUME_DOC}); a served replica waits for it and starts once it is whole")
