"""The recorded results the instance-throughput report reads, normalised; missing parts are None.

Each reader takes the JSON another tool wrote and keeps only what the report needs. Keys not
listed are ignored; a missing key or file leaves its measurement out of the report, not an error.

(a) `siglip-serve bench --json FILE` (serve/bench.py):
    {"encoder": [{"bucket": 1, "images_per_second": 35.4, "latency_mean_ms": 28.2, ...}, ...],
     "model", "backend", "buckets", "machine": {...}}   (or model/backend/lnc under "config"/"settings")
(b) `models.multicore_bench.run_multicore(...)` (`python -m models.multicore_bench --json FILE`):
    {"lnc": 2, "cores": 4, "bucket": 1, "model", "backend", "machine",
     "workers": [{"core": "0", "images_per_second": 35.4, "latency_ms": 28.2, ...}, ...],
     "instance_images_per_second": 141.1, ...}
(c) `siglip-serve loadtest --out DIR` -> DIR/summary.json (loadtest/summary.py): saturation, steps,
    server, metrics_check.
Seed 000's reference rows come from `models.multicore_bench.SEED_REFERENCE`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_ALIASES = {"latency_ms": ("latency_ms", "latency_mean_ms", "mean_latency_ms")}


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
    """{lnc: {cores, per_core, instance, latency_ms, auto_cast, label}}: seed 000's multi-core rows
    from models.multicore_bench.SEED_REFERENCE (the LNC=1 row is the un-cast fp32 compile)."""
    from models.multicore_bench import SEED_REFERENCE

    return {row["lnc"]: {"cores": row["cores"], "per_core": row["per_core_images_per_second"],
                         "instance": row["instance_images_per_second"], "latency_ms": row["latency_ms"],
                         "auto_cast": row["auto_cast"], "label": row["label"]}
            for row in SEED_REFERENCE if row["cores"] > 1}


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
    """(b): run_multicore's result (python -m models.multicore_bench --json): one worker per logical
    core, summed."""
    if not data or not isinstance(data.get("instance_images_per_second"), (int, float)):
        return None
    per_core = [{"core": w["core"], "images_per_second": float(w["images_per_second"]),
                 "latency_ms": w.get("latency_ms")} for w in data.get("workers") or []]
    return {"images_per_second": float(data["instance_images_per_second"]), "cores": data.get("cores"),
            "per_core": per_core, "lnc": data.get("lnc"), "bucket": data.get("bucket"), "model": data.get("model"),
            "backend": data.get("backend"), "machine": data.get("machine")}


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
