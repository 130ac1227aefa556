"""The recorded results the instance-throughput report reads, normalised; missing parts are None.

Each reader takes the JSON another tool wrote and keeps only what the report needs. Keys not
listed are ignored; a missing key or file leaves its measurement out of the report, not an error.

(a) `siglip-serve bench --json FILE` (serve/bench.py):
    {"encoder": [{"bucket": 1, "images_per_second": 35.4, "latency_mean_ms": 28.2, ...}, ...],
     "model", "backend", "buckets", "machine": {...}}   (or model/backend/lnc under "config"/"settings")
(b) `models.multicore_bench.run_multicore(...)`, one worker per logical core, summed:
    {"lnc": 2, "cores" | "logical_cores": 4, "bucket" | "batch_size": 1, "model", "backend", "machine",
     "per_core" | "workers": [{"core": 0, "images_per_second": 35.4, "latency_ms": 28.2}, ...],
     "total_images_per_second" | "instance_images_per_second" | "images_per_second": 141.1}
    (the total is summed from per_core when absent)
(c) `siglip-serve loadtest --out DIR` -> DIR/summary.json (loadtest/summary.py): saturation, steps,
    server, metrics_check.
Seed 000's reference rows come from `models.multicore_bench.SEED_REFERENCE` when that module is
installed, else from SEED_000 below (the seed's own table).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# Seed 000 (trn2.3xlarge, SigLIP-SO400M-14-384, --auto-cast matmult, batch 1): the fallback when
# models.multicore_bench is not importable.
SEED_000 = {
    2: {"cores": 4, "per_core": 35.43, "instance": 141.1, "latency_ms": 28.23},
    1: {"cores": 8, "per_core": 14.38, "instance": 115.0, "latency_ms": 69.56},
}

_ALIASES = {
    "cores": ("cores", "logical_cores", "num_cores", "workers"),
    "per_core": ("per_core", "per_core_images_per_second", "images_per_second_per_core"),
    "instance": ("instance", "instance_images_per_second", "total_images_per_second", "images_per_second"),
    "latency_ms": ("latency_ms", "latency_mean_ms", "mean_latency_ms"),
}


def _first(mapping: dict[str, Any], keys: tuple[str, ...]) -> Any:
    return next((mapping[k] for k in keys if isinstance(mapping.get(k), (int, float))), None)


def read_json(path: str | Path | None) -> dict[str, Any] | None:
    if not path:
        return None
    file = Path(path)
    if not file.exists():
        return None
    data = json.loads(file.read_text())
    return data if isinstance(data, dict) else None


def seed_reference() -> dict[int, dict[str, Any]]:
    """{lnc: {cores, per_core, instance, latency_ms}} from the multi-core bench module, else the seed table."""
    try:
        from models.multicore_bench import SEED_REFERENCE  # type: ignore[import-not-found]
    except Exception:  # noqa: BLE001 - not installed yet, or fails to import off Neuron: use the seed table
        return SEED_000
    rows: dict[int, dict[str, Any]] = {}
    items = SEED_REFERENCE.items() if isinstance(SEED_REFERENCE, dict) else \
        ((r.get("lnc"), r) for r in SEED_REFERENCE if isinstance(r, dict))
    for key, row in items:
        try:
            lnc = int(str(row.get("lnc", key)).lower().replace("lnc", "").strip("=_ "))
        except (ValueError, AttributeError):
            continue
        normal = {name: _first(row, aliases) for name, aliases in _ALIASES.items()}
        if normal["per_core"] is not None or normal["instance"] is not None:
            rows[lnc] = normal
    return rows or SEED_000


def _settings(data: dict[str, Any]) -> dict[str, Any]:
    for key in ("config", "settings"):
        if isinstance(data.get(key), dict):
            return data[key]
    return data


def single_core(bench: dict[str, Any] | None) -> dict[str, Any] | None:
    """(a): bare encoder on one core, per bucket; batch 1 is the seed's per-core figure."""
    rows = [r for r in (bench or {}).get("encoder") or [] if isinstance(r, dict)
            and isinstance(r.get("images_per_second"), (int, float)) and r.get("bucket") is not None]
    if not rows:
        return None
    settings = _settings(bench or {})
    best = max(rows, key=lambda r: r["images_per_second"])
    batch1 = next((r for r in rows if int(r["bucket"]) == 1), None)
    return {
        "buckets": {int(r["bucket"]): float(r["images_per_second"]) for r in rows},
        "latency_ms": {int(r["bucket"]): _first(r, _ALIASES["latency_ms"]) for r in rows},
        "batch1_images_per_second": float(batch1["images_per_second"]) if batch1 else None,
        "batch1_latency_ms": _first(batch1, _ALIASES["latency_ms"]) if batch1 else None,
        "best_bucket": int(best["bucket"]),
        "best_images_per_second": float(best["images_per_second"]),
        "model": settings.get("model"), "backend": settings.get("backend"), "lnc": settings.get("lnc"),
        "machine": bench.get("machine") if bench else None,
    }


def multi_core(data: dict[str, Any] | None) -> dict[str, Any] | None:
    """(b): one worker per logical core, summed."""
    if not data:
        return None
    workers = next((data[k] for k in ("per_core", "workers", "cores") if isinstance(data.get(k), list)), [])
    per_core = [{"core": w.get("core", w.get("index", i)), "images_per_second": float(w["images_per_second"]),
                 "latency_ms": _first(w, _ALIASES["latency_ms"])}
                for i, w in enumerate(workers) if isinstance(w, dict)
                and isinstance(w.get("images_per_second"), (int, float))]
    total = _first(data, ("total_images_per_second", "instance_images_per_second", "images_per_second"))
    if total is None and per_core:
        total = sum(w["images_per_second"] for w in per_core)
    if total is None:
        return None
    settings = _settings(data)
    cores = _first(data, ("cores", "logical_cores", "num_cores")) or (len(per_core) or None)
    return {"images_per_second": float(total), "cores": cores, "per_core": per_core,
            "lnc": data.get("lnc", settings.get("lnc")), "bucket": _first(data, ("bucket", "batch_size", "batch")),
            "model": settings.get("model"), "backend": settings.get("backend"), "machine": data.get("machine")}


def served(summary: dict[str, Any] | None) -> dict[str, Any] | None:
    """(c): the load test's saturation point, its steps and the metrics cross-check."""
    if not summary:
        return None
    saturation = summary.get("saturation")
    return {
        "images_per_second": saturation.get("images_per_second") if isinstance(saturation, dict) else None,
        "saturation": saturation,
        # No step kept p99 under the target: what was measured is still shown, marked as over it.
        "over_target": None if saturation else over_target(summary),
        "steps": summary.get("steps") or [],
        "server": summary.get("server") or {},
        "client": summary.get("client") or {},
        "metrics_check": summary.get("metrics_check"),
        "images": summary.get("images"),
        "failures": summary.get("failures"),
        "settings": summary.get("settings") or {},
    }


def over_target(summary: dict[str, Any]) -> dict[str, Any] | None:
    """The step with the most img/s when none met the p99 target (or the whole run, if no steps)."""
    steps = [w for w in summary.get("steps") or [] if w.get("images")]
    target = (summary.get("settings") or {}).get("p99_target_ms")
    if steps:
        best = max(steps, key=lambda w: w["images_per_second"])
        return {"users": best["users"], "images_per_second": best["images_per_second"],
                "latency_ms": dict(best["latency_ms"]), "fail_ratio": best["fail_ratio"], "p99_target_ms": target}
    if summary.get("images"):
        return {"users": (summary.get("settings") or {}).get("users"),
                "images_per_second": summary.get("images_per_second"), "latency_ms": summary.get("latency_ms") or {},
                "fail_ratio": summary.get("fail_ratio"), "p99_target_ms": target}
    return None
