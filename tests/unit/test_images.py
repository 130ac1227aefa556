"""deploy/images/: each Containerfile's base, pins and command agree with the constraints files and the
KubeRay manifests. No image is built here (no container daemon on the development machine); this is
the check that runs everywhere."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO

IMAGES = REPO / "deploy" / "images"


def instructions(name: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with comments dropped and continued lines joined."""
    text = re.sub(r"\\\n\s*", " ", "\n".join(line for line in (IMAGES / name).read_text().splitlines()
                                             if not line.lstrip().startswith("#")))
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line.strip() else "")
            for line in text.splitlines() if line.strip()]


def first(name: str, kind: str) -> list[str]:
    return [args for instruction, args in instructions(name) if instruction == kind]


def constraint(file: str, package: str) -> str:
    for line in (REPO / file).read_text().splitlines():
        if line.startswith(f"{package}=="):
            return line.split("==", 1)[1]
    raise AssertionError(f"{package} not pinned in {file}")


@pytest.mark.parametrize("name", ["cpu.Containerfile", "cuda.Containerfile", "neuron-2.31.Containerfile",
                                  "neuron-native.Containerfile"])
def test_every_image_resets_the_entrypoint_and_pins_its_base(name: str) -> None:
    assert first(name, "ENTRYPOINT") == ["[]"]  # a DLC's TorchServe entrypoint must not run ours
    (base,) = first(name, "FROM")
    args = dict(a.split("=", 1) if "=" in a else (a, "") for a in first(name, "ARG"))
    image = args.get("BASE_IMAGE", "") if base == "${BASE_IMAGE}" else base
    # A required build argument, or a versioned tag: never latest, never untagged.
    assert image == "" or (":" in image and not image.endswith(":latest")), image
    for command in first(name, "RUN"):
        if "apt-get install" in command:
            assert "--no-install-recommends" in command and "rm -rf /var/lib/apt/lists/*" in command


def test_the_trace_image_is_the_dlc_of_the_constraints_release_and_installs_with_them() -> None:
    header = (REPO / "constraints-neuron-2.31.txt").read_text()
    release = re.search(r"Neuron SDK (\d+\.\d+\.\d+)", header).group(1)  # type: ignore[union-attr]
    torch_series = constraint("constraints-neuron-2.31.txt", "torch").rstrip(".*")
    (arg,) = [a for a in first("neuron-2.31.Containerfile", "ARG") if a.startswith("BASE_IMAGE=")]
    tag = arg.split(":", 1)[1]
    assert tag.startswith(f"{torch_series}.0-neuronx-") and f"-sdk{release}-" in tag
    (install,) = first("neuron-2.31.Containerfile", "RUN")
    assert "-c constraints-neuron-2.31.txt" in install and "'.[neuron,kernels]'" in install
    assert "pip.repos.neuron.amazonaws.com" in install


def test_the_native_image_installs_the_exact_torch_of_its_constraints() -> None:
    (install,) = [r for r in first("neuron-native.Containerfile", "RUN") if "pip install" in r]
    assert "-c constraints-neuron-native.txt" in install and "'.[neuron-native]'" in install
    assert constraint("constraints-neuron-native.txt", "torch") == "2.14.0"
    assert "BASE_IMAGE" in first("neuron-native.Containerfile", "ARG")  # required: no tag we could verify


def _comments(name: str) -> str:
    return "\n".join(line.lstrip("# ") for line in (IMAGES / name).read_text().splitlines()
                     if line.lstrip().startswith("#"))


def test_the_trace_images_tag_query_takes_the_2_31_0_or_the_2_31_1_dlc() -> None:
    """Issue 41: the README lists sdk2.31.1 beside sdk2.31.0, with the same torch-neuronx and neuronx-cc."""
    (query,) = re.findall(r"--query '([^']+)'", _comments("neuron-2.31.Containerfile").replace("\\\n", " "))
    tags = set(re.findall(r"imageTag==`([^`]+)`", query))
    assert tags == {"2.9.0-neuronx-py312-sdk2.31.0-ubuntu24.04", "2.9.0-neuronx-py312-sdk2.31.1-ubuntu24.04"}
    (arg,) = [a for a in first("neuron-2.31.Containerfile", "ARG") if a.startswith("BASE_IMAGE=")]
    assert arg.split(":", 1)[1] in tags


def test_the_native_image_fits_a_python_3_14_dlc_and_refuses_another_python() -> None:
    """Issue 41: Neuron 2.33's DLCs are Python 3.14 only; TorchNeuron has wheels for 3.12-3.14. The image
    installs wheels only, and its Python check (run here as the build would) refuses 3.11 and takes 3.14."""
    assert "--repository-name neuron/pytorch-training-neuronx" not in _comments("neuron-native.Containerfile")
    check, install = first("neuron-native.Containerfile", "RUN")
    assert "--only-binary=:all:" in shlex.split(install)
    code = shlex.split(check)[2]
    for version, refused in [((3, 11, 7), True), ((3, 12, 0), False), ((3, 14, 0), False), ((3, 15, 0), True)]:
        run = subprocess.run([sys.executable, "-c", f"import sys; sys.version_info = {version}; exec({code!r})"],
                             capture_output=True, text=True, timeout=60)
        assert (run.returncode != 0) == refused, (version, run.stderr)
        if refused:
            assert f"this base has Python {version[0]}.{version[1]}; TorchNeuron 2.14.3 needs 3.12-3.14" in run.stderr


@pytest.mark.parametrize(("name", "backend"), [("cpu.Containerfile", "cpu"), ("cuda.Containerfile", "cuda")])
def test_the_cpu_and_cuda_images_serve_on_every_interface_with_their_backend(name: str, backend: str) -> None:
    (cmd,) = first(name, "CMD")
    command = json.loads(cmd)
    assert command[:2] == ["siglip-serve", "run"] and command[command.index("--host") + 1] == "0.0.0.0"
    assert (command[command.index("--backend") + 1] if "--backend" in command else "cpu") == backend


def _backend(document: dict) -> str:
    spec = document["spec"]
    if document["kind"] == "RayService":
        return str(yaml.safe_load(spec["serveConfigV2"])["applications"][0]["args"]["backend"])
    command = shlex.split(spec["entrypoint"])
    return command[command.index("--backend") + 1]


@pytest.mark.parametrize("manifest", ["rayservice.yaml", "rayjob-embed.yaml"])
def test_the_kuberay_manifests_name_the_image_of_their_backend(manifest: str) -> None:
    document = yaml.safe_load((REPO / "deploy" / "kuberay" / manifest).read_text())
    expected = {"neuron": "siglip-serve-neuron-2.31", "neuron-native": "siglip-serve-neuron-native"}[_backend(document)]
    assert {c["image"].rsplit("/", 1)[1].split(":")[0] for c in _containers(document)} == {expected}


def _containers(document: object) -> list[dict]:
    found: list[dict] = []
    if isinstance(document, dict):
        if "containers" in document:
            found.extend(document["containers"])
        for value in document.values():
            found.extend(_containers(value))
    elif isinstance(document, list):
        for value in document:
            found.extend(_containers(value))
    return found


def test_the_build_context_leaves_out_this_machines_venv() -> None:
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".venv", ".venv-moto", ".venv-latest", "build", ".git"} <= set(ignored)
    # The runtime images copy what they install, by name: never the tests or a local venv.
    for name in ("cpu.Containerfile", "cuda.Containerfile"):
        assert all(not copy.startswith(". ") for copy in first(name, "COPY")), name


@pytest.mark.parametrize("name", ["cpu.Containerfile", "cuda.Containerfile"])
def test_the_cpu_and_cuda_images_install_exactly_the_runtime_lock_and_run_as_a_non_root_user(name: str) -> None:
    runs = first(name, "RUN")
    (locked,) = [r for r in runs if "-r " in r]
    lock = re.search(r"-r (\S+)", locked).group(1)  # type: ignore[union-attr]
    assert "--require-hashes" in locked and "--no-deps" in locked, locked
    assert Path(lock).name == "runtime-py3.12.txt" and (REPO / "requirements" / Path(lock).name).is_file()
    # The lock's file is copied in before it is installed; our package goes on top without resolving anything.
    assert any(Path(lock).name in copy for copy in first(name, "COPY"))
    (ours,) = [r for r in runs if "/opt/siglip-serve &&" in r or r.rstrip().endswith("/opt/siglip-serve")]
    assert "--no-deps" in ours and "pip check" in ours, ours
    (user,) = first(name, "USER")
    assert user not in ("root", "0") and not user.startswith("0:"), user
    assert [kind for kind, _ in instructions(name)].index("USER") > max(
        i for i, (kind, _) in enumerate(instructions(name)) if kind == "RUN")
