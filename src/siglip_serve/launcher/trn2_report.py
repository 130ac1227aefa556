"""What `siglip-serve trn2-check` reads back out of its own folder for the summary: where every NEFF
landed, the cosine each variant observed, each replica's warm-start seconds, and the answer to each
question the docs leave to hardware (docs/torchneuron.md "What the docs do not settle",
docs/kernels.md "First run on a trn2"). It imports neither torch nor the SDK.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from siglip_serve.core.constants import VISIBLE_CORES_ENV
from siglip_serve.models.neuron.env import (
    COMPILE_CACHE_URL_ENV,
    DEFAULT_COMPILE_CACHE,
    LOCAL_NEFF_CACHE_ENV,
    NEFF_CACHE_ENV,
    default_neff_caches,
)

# Where the steps that load an artifact may write a NEFF besides the artifacts: the trace line's compile cache
# default, TorchNeuron's own caches when its variables are unset (`neff_cache` and the local tier
# `local_cache` in the temp directory: models/neuron/env.py default_neff_caches) and whatever cache variables
# this shell sets (those steps run with it). A native NEFF there means a compile ran without the artifact's
# environment. The kernel steps write to their own caches under DIR (trn2_steps.kernel_caches): no place here.
CACHE_ENV = (NEFF_CACHE_ENV, LOCAL_NEFF_CACHE_ENV, COMPILE_CACHE_URL_ENV)
# Only these steps' windows count, every step that loads an artifact with its environment (each may compile
# what the artifact lacks): a NEFF from before the run is another run's, one from after is the kernels'.
WINDOW_STEPS = ("compile-", "accuracy-", "serve-", "multicore-")
# File times are truncated to the filesystem's granularity (whole seconds on some), so a NEFF written in a
# step's first second may carry a time just before its recorded start; none carries one after it was written.
MTIME_SLACK_S = 1.0


def artifact_places(out: Path) -> list[Path]:
    return sorted(p.resolve() for p in out.glob("artifacts-*") if p.is_dir())


def neff_places(out: Path) -> list[Path]:
    places = [*artifact_places(out), Path(DEFAULT_COMPILE_CACHE), *default_neff_caches()]
    places += [Path(os.environ[k]) for k in CACHE_ENV if os.environ.get(k) and "://" not in os.environ[k]]
    return list(dict.fromkeys(p.resolve() for p in places))


def step_windows(windows: Mapping[str, tuple[float, float]]) -> list[tuple[float, float]]:
    """The (start, end) of each step that ran and loads an artifact (WINDOW_STEPS), by its name."""
    return [window for name, window in windows.items() if name.startswith(WINDOW_STEPS)]


def neff_files(out: Path, windows: Sequence[tuple[float, float]]) -> dict[str, Any]:
    """Every *.neff written during the steps that load an artifact (`windows`) in a place they could write
    to: path, bytes and which place; the artifacts' places first, so a file is counted once. Older and
    later files in those places are only counted, not listed."""
    files: list[dict[str, Any]] = []
    seen: set[Path] = set()
    not_in_window = 0
    artifacts = artifact_places(out)
    for place in neff_places(out):
        if not place.is_dir():
            continue
        for path in place.rglob("*.neff"):
            if path in seen or not path.is_file():
                continue
            seen.add(path)
            stat = path.stat()
            if any(start - MTIME_SLACK_S <= stat.st_mtime <= end for start, end in windows):
                files.append({"path": str(path), "bytes": stat.st_size, "place": str(place)})
            else:
                not_in_window += 1
    outside = sorted({str(f["place"]) for f in files if Path(f["place"]) not in artifacts})
    return {"places": [str(p) for p in neff_places(out)], "windows": [list(w) for w in windows], "files": files,
            "outside_the_artifacts": outside, "not_written_during_the_steps": not_in_window}


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def cosines(out: Path, lines: tuple[str, ...] = ("trace", "native")) -> dict[str, Any]:
    """The cosine each accuracy step observed (None where it did not run)."""
    found: dict[str, Any] = {}
    for line in lines:
        data = _json(out / f"accuracy-{line}.json")
        found[line] = None if not isinstance(data, dict) else {
            k: data.get(k) for k in ("cosine_min", "cosine_mean", "passed", "b")}
    return found


def _warm(data: Any) -> Iterator[dict[str, Any]]:
    if isinstance(data, dict):
        if "warmup_seconds" in data:
            yield {k: data.get(k) for k in ("backend", "replica", "neuron_rt_visible_cores", "warmup_seconds")}
        for value in data.values():
            yield from _warm(value)
    elif isinstance(data, list):
        for value in data:
            yield from _warm(value)


def warm_starts(out: Path, lines: tuple[str, ...] = ("trace", "native")) -> dict[str, Any]:
    """Per line: seconds until /readyz and each replica's warm-up seconds per bucket, from /v1/models."""
    found: dict[str, Any] = {}
    for line in lines:
        data = _json(out / f"serve-{line}.json")
        found[line] = None if not isinstance(data, dict) else {
            "ready_seconds": data.get("ready_seconds"), "replicas": list(_warm(data.get("models")))}
    return found


def kernel_settings(out: Path) -> str:
    """What each `kernels check` ran against (its JSON's `setting`: line, simulator target, budgets)."""
    parts = []
    for where in ("simulator", "neuron"):
        data = _json(out / f"kernels-{where}.json")
        setting = data.get("setting") if isinstance(data, dict) else None
        if setting:
            parts.append(f"{where}: " + "; ".join(f"{k} {v}" for k, v in setting.items()))
    return "".join(f" ({part})" for part in parts)


def ray_answer(out: Path) -> str:
    """From versions.json's `ray_neuron` (launcher/trn2_probes.py ray_neuron_view)."""
    data = _json(out / "versions.json")
    view = data.get("ray_neuron") if isinstance(data, dict) else None
    if not isinstance(view, dict):
        return "no versions.json with Ray's view"
    detected = view.get("ray_detected_neuron_cores", view.get("ray_detected_error"))
    text = (f"{VISIBLE_CORES_ENV}={view.get(VISIBLE_CORES_ENV)}; Ray reads ids "
            f"{view.get('ray_visible_ids', view.get('ray_error'))}; Ray's neuron-ls count: {detected}")
    if view.get("ray_sees_fewer_cores_than_the_runtime"):
        text += f"; FEWER than the runtime's {len(view.get('runtime_cores') or [])}: a range, which `ray start` refuses"
    return text


def hardware_answers(out: Path, steps: dict[str, str], neffs: dict[str, Any]) -> list[dict[str, str]]:
    """Each question the docs leave to a trn2, with what this run found (or why it did not say)."""
    native = cosines(out).get("native") or {}
    cos = native.get("cosine_min")
    native_neffs = [f for f in neffs["files"] if "artifacts-native" in f["path"]]
    verdict = ("no accuracy-native result" if cos is None else
               f"cosine_min {cos:.6f}: exactly 1.0, the graphs look un-cast (the flag may not have won)" if cos >= 1.0
               else f"cosine_min {cos:.6f}: below 1.0 and within the gate, auto-cast took effect"
               if native.get("passed") else f"cosine_min {cos:.6f}: under the gate; compare with --auto-cast none")

    def status(name: str) -> str:
        return steps.get(name, "not run")

    return [
        {"question": "NEURON_CC_FLAGS reach neuronx-cc on the torch.compile path, and --auto-cast=matmult wins "
                     "over TorchNeuron's own --auto-cast=none (docs/torchneuron.md)",
         "answer": verdict},
        {"question": "NEURON_COMPILER_OPT_LEVEL reaches neuronx-cc (-O3 in the recipe; the docs give no default)",
         "answer": f"compile-native {status('compile-native')}: look for -O3 in logs/compile-native.log"},
        {"question": "TorchNeuron's NEFF cache layout and that TORCH_NEURONX_NEFF_CACHE_DIR is honoured",
         "answer": f"{len(native_neffs)} NEFF file(s) under artifacts-native; NEFFs the artifact steps "
                   f"wrote outside the artifacts: "
                   f"{', '.join(neffs['outside_the_artifacts']) or 'none'}"},
        {"question": "a restart finds every graph in the cache (no neuronx-cc run at replica start)",
         "answer": f"serve-native {status('serve-native')} (a replica that compiled at start refuses to run)"},
        {"question": "NKI kernels against the references, simulator and NeuronCore, on the line found "
                     "(docs/kernels.md, first run 1), and the SBUF/PSUM budgets NKI reports",
         "answer": f"kernels-simulator {status('kernels-simulator')}, kernels-neuron {status('kernels-neuron')}"
                   + kernel_settings(out)},
        {"question": "What Ray makes of the NeuronCores: NEURON_RT_VISIBLE_CORES split on commas only, and its "
                     "own neuron-ls count (siglip-serve run expands a range before it starts Ray)",
         "answer": ray_answer(out)},
        {"question": "docs/kernels.md first run 2-6 (pytest -m nki, matmul, mlp, siglip, profile-neff)",
         "answer": "not run by trn2-check: run them by hand as docs/kernels.md lists, at LNC=2 and LNC=1"},
    ]


def neuron_sdks(out: Path) -> list[dict[str, Any]]:
    """Each probed Python's Neuron SDK as found beside the one its line is pinned to (versions*.json's
    `neuron_sdk`, launcher/trn2_probes.py)."""
    found = []
    for path in sorted(out.glob("versions*.json")):
        data = _json(path)
        if isinstance(data, dict):
            sdk = data.get("neuron_sdk") or {}
            found.append({"python": data.get("executable"), "line": data.get("line"),
                          "torch_neuronx": (data.get("versions") or {}).get("torch_neuronx"),
                          "found": sdk.get("found"), "pinned": sdk.get("pinned")})
    return found


def report(out: Path, steps: dict[str, str], windows: Mapping[str, tuple[float, float]]) -> dict[str, Any]:
    """Everything above, written to DIR/report.json, and returned for the summary. `windows`: each step's
    wall-clock (start, end), by name."""
    neffs = neff_files(out, step_windows(windows))
    data = {"neff_files": neffs, "cosines": cosines(out), "warm_starts": warm_starts(out),
            "neuron_sdks": neuron_sdks(out), "hardware_answers": hardware_answers(out, steps, neffs)}
    (out / "report.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    return data


def markdown(data: dict[str, Any]) -> list[str]:
    md = ["", "## What this run found", ""]
    for sdk in data.get("neuron_sdks", []):
        # Only the native line refuses by release (models/neuron/env.py check_native_sdk).
        differs = sdk["line"] == "native" and sdk["found"] != sdk["pinned"]
        md.append(f"- Neuron SDK, {sdk['python']}: torch-neuronx {sdk['torch_neuronx'] or 'none'}, Neuron "
                  f"{sdk['found'] or 'unknown'} found, {sdk['pinned'] or 'none'} pinned for the {sdk['line'] or 'no'} "
                  f"line" + (" (the backend refuses it: docs/torchneuron.md)" if differs else ""))
    for line, found in data["cosines"].items():
        md.append(f"- accuracy, {line} line: " + ("not run" if not found else
                                                  f"cosine min {found['cosine_min']}, mean {found['cosine_mean']}"))
    for line, found in data["warm_starts"].items():
        md.append(f"- serve, {line} line: " + ("not run" if not found else
                                               f"ready in {found['ready_seconds']} s; replicas' warm-up (s per "
                                               f"bucket): {[r['warmup_seconds'] for r in found['replicas']]}"))
    neffs = data["neff_files"]
    md.append(f"- NEFF files written during the steps that load an artifact (compile, accuracy, serve, "
              f"multi-core): {len(neffs['files'])} (`report.json` "
              f"lists each); outside the artifacts: {', '.join(neffs['outside_the_artifacts']) or 'none'}")
    md += ["", "## Only hardware can tell", "", "| question | this run |", "|---|---|"]
    md += [f"| {a['question']} | {a['answer']} |" for a in data["hardware_answers"]]
    return md
