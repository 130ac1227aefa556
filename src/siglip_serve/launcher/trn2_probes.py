"""The two checks of `siglip-serve trn2-check` that are not another command: what this Python sees
of the Neuron SDK, and a short life of the served application. Each runs as its own subprocess
(`python -m siglip_serve.launcher.trn2_probes versions OUT.json` / `serve OUT.json ...`), so a crash or a held
NeuronCore ends with it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from siglip_serve.core.backends import BACKENDS
from siglip_serve.core.cli import run_main
from siglip_serve.core.errors import UserError
from siglip_serve.core.sample_photos import photo_jpeg
from siglip_serve.models.neuron.sdk import sdk_line

MODEL = "tiny-siglip"


class ProbeFailed(UserError, RuntimeError):
    """The served application did not come up or did not answer; trn2-check reads exit code 1 as failed."""

    exit_code = 1


def versions() -> dict[str, Any]:
    """Versions, the SDK line, the runtime LNC and the Neuron environment, as this Python sees them."""
    from siglip_serve.models.neuron.sdk import LncMismatch, package_version, runtime_lnc

    info: dict[str, Any] = {"python": sys.version.split()[0], "executable": sys.executable,
                            "platform": platform.platform()}
    try:
        module = importlib.import_module("torch_neuronx")
        error = None
    except Exception as exc:  # broad on purpose: absent, PyPI's placeholder, or a broken install: all "no SDK"
        module, error = None, f"{type(exc).__name__}: {exc}"
    neuronx = package_version("torch-neuronx")
    if module is not None and neuronx in (None, "1.0"):
        neuronx = str(getattr(module, "__version__", "unknown"))
    info["versions"] = {name: package_version(dist) for name, dist in (
        ("torch", "torch"), ("torchvision", "torchvision"), ("neuronx_cc", "neuronx-cc"),
        ("libneuronxla", "libneuronxla"), ("nki", "nki"), ("open_clip", "open_clip_torch"), ("ray", "ray"))}
    info["versions"]["torch_neuronx"] = neuronx if module is not None else None
    info["sdk_import_error"] = error
    info["line"] = sdk_line(info["versions"]["torch_neuronx"], hasattr(module, "trace"))
    from siglip_serve.models.neuron.env import NEURON_RELEASES, SDK_RELEASE, neuron_release

    # The SDK this venv holds beside the one its line is pinned to (a newer DLAMI may hold a newer one).
    pinned = {"native": SDK_RELEASE, "trace": NEURON_RELEASES["2.9.0.2.15"]}.get(info["line"] or "")
    info["neuron_sdk"] = {"found": neuron_release(info["versions"]["torch_neuronx"]), "pinned": pinned}
    try:
        lnc, explicit = runtime_lnc()
        info["lnc"], info["lnc_explicit"], info["lnc_error"] = lnc, explicit, None
    except LncMismatch as exc:
        info["lnc"], info["lnc_explicit"], info["lnc_error"] = None, True, str(exc)
    info["env"] = {k: v for k, v in os.environ.items() if k.startswith("NEURON_")}
    from siglip_serve.models.neuron.sdk import nki_status

    usable, reason = nki_status()
    info["nki"] = {"usable": usable, "reason": reason}
    info["ray_neuron"] = ray_neuron_view()
    return info


def ray_neuron_view() -> dict[str, Any]:
    """What Ray's Neuron accelerator manager (ray/_private/accelerators/neuron.py) makes of this machine: the
    NeuronCore ids it reads from NEURON_RT_VISIBLE_CORES (split on commas only) and the cores it detects with
    neuron-ls, beside the cores the variable names for the Neuron runtime (ranges expanded)."""
    from siglip_serve.core.constants import VISIBLE_CORES_ENV, expand_visible_cores

    raw = os.environ.get(VISIBLE_CORES_ENV)
    view: dict[str, Any] = {VISIBLE_CORES_ENV: raw}
    if raw:
        try:
            view["runtime_cores"] = expand_visible_cores(raw)
        except ValueError as exc:
            view["runtime_cores_error"] = str(exc)
    try:
        from ray._private.accelerators.neuron import NeuronAcceleratorManager
    except ImportError as exc:
        view["ray_error"] = f"{type(exc).__name__}: {exc}"
        return view
    ids = NeuronAcceleratorManager.get_current_process_visible_accelerator_ids()
    view["ray_visible_ids"] = ids
    try:
        view["ray_detected_neuron_cores"] = NeuronAcceleratorManager.get_current_node_num_accelerators()
    except Exception as exc:  # broad on purpose: Ray's own neuron-ls reader failing is itself the answer
        view["ray_detected_error"] = f"{type(exc).__name__}: {exc}"
    cores = view.get("runtime_cores")
    view["ray_sees_fewer_cores_than_the_runtime"] = ids is not None and cores is not None and len(ids) < len(cores)
    return view


def serve(out: Path, backend: str, artifact_dir: str, ready_timeout_s: float) -> dict[str, Any]:
    """Start `siglip-serve run` (one replica on one declared core), wait for /readyz, embed one photo,
    read /v1/models, stop it. Raises ProbeFailed naming what went wrong."""
    import httpx

    from siglip_serve.core.poll import poll
    from siglip_serve.launcher.preflight import free_port

    port, metrics_port = free_port(), free_port()
    cmd = [sys.executable, "-m", "siglip_serve", "run", "--backend", backend, "--artifact-dir", artifact_dir,
           "--model", MODEL, "--buckets", "1,2", "--replicas", "1", "--neuron-cores", "1",
           "--port", str(port), "--metrics-port", str(metrics_port)]
    print("starting:", " ".join(cmd[2:]), flush=True)
    began = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=sys.stdout, stderr=sys.stderr)
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, timeout=60) as client:
            def ready() -> bool:
                if proc.poll() is not None:
                    raise ProbeFailed(f"siglip-serve run exited with code {proc.returncode} before it was ready")
                try:
                    return client.get("/readyz").status_code == 200
                except httpx.TransportError:
                    return False

            if not poll(ready, bool, ready_timeout_s, interval_s=2.0)[1]:
                raise ProbeFailed(f"not ready within {ready_timeout_s:.0f} s")
            ready_s = time.monotonic() - began
            response = client.post("/v1/embeddings/image", content=photo_jpeg("chelsea"),
                                   headers={"Content-Type": "image/jpeg"})
            if response.status_code != 200:
                raise ProbeFailed(f"POST /v1/embeddings/image answered {response.status_code}: {response.text[:300]}")
            embedding = response.json()["data"][0]["embedding"]
            models = client.get("/v1/models").json()
        norm = sum(v * v for v in embedding) ** 0.5
        return {"backend": backend, "artifact_dir": artifact_dir, "ready_seconds": round(ready_s, 1),
                "embedding_dim": len(embedding), "embedding_norm": norm, "models": models}
    finally:
        proc.terminate()  # the runner stops Serve and its Ray on SIGTERM
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m siglip_serve.launcher.trn2_probes", description=__doc__)
    sub = parser.add_subparsers(dest="probe", required=True)
    v = sub.add_parser("versions")
    v.add_argument("out", type=Path)
    s = sub.add_parser("serve")
    s.add_argument("out", type=Path)
    s.add_argument("--backend", required=True, choices=BACKENDS)
    s.add_argument("--artifact-dir", required=True)
    s.add_argument("--ready-timeout", type=float, default=900.0)
    args = parser.parse_args(argv)
    return run_main(lambda: _probe(args))


def _probe(args: argparse.Namespace) -> int:
    result = versions() if args.probe == "versions" else serve(args.out, args.backend, args.artifact_dir,
                                                               args.ready_timeout)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
