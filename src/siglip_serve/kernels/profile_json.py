"""Read Neuron Explorer's profile summaries and compare kernels.

Two layouts are read, both with the Summary table's fields (Neuron Explorer profile schema reference,
"Summary"; times in seconds, utilisations in percent):

* ``neuron-explorer view ... --output-format summary-json``: ``{<profile id>: {...summary...}}``, the
  machine-readable summary Explorer keeps supporting;
* ``--output-format json``: ``{"summary": [{...}], "instruction": [...]}``, which the schema reference
  calls legacy and "not recommended", and Neuron 2.33 is the last release to write.

``neuron-profile``, the tool that wrote the second layout first, left the SDK (end of support in Neuron
2.29, gone from 2.30); no command line for it is built here. Tables show microseconds.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from siglip_serve.kernels.errors import KernelInputError

ENGINES = ("tensor", "dma", "vector", "scalar", "gpsimd", "sync")


class ProfileJSONError(KernelInputError):
    """The file is not a Neuron Explorer summary we can read."""


@dataclass(frozen=True)
class ProfileSummary:
    kernel: str
    config: str
    total_time_s: float
    tensor_engine_active_time_s: float | None = None
    dma_active_time_s: float | None = None
    vector_engine_active_time_s: float | None = None
    scalar_engine_active_time_s: float | None = None
    gpsimd_engine_active_time_s: float | None = None
    sync_engine_active_time_s: float | None = None
    neuroncore_cycle_count: int | None = None
    hardware_flops: int | None = None
    matmul_instruction_count: int | None = None
    event_count: int | None = None
    trace_count: int | None = None
    hbm_read_bytes: int | None = None
    hbm_write_bytes: int | None = None
    inputs_outputs_weights_size_bytes: int | None = None
    sbuf_read_bytes: int | None = None
    sbuf_write_bytes: int | None = None
    # Explorer's MFU counts the HLO model's matmuls, so it is 0 for an NKI kernel; HFU (and MFU from the
    # instruction trace) count what the Tensor Engine executed. MBU divides HBM traffic by one HBM stack's
    # bandwidth at either LNC.
    mfu_estimated_percent: float | None = None
    mfu_max_achievable_estimated_percent: float | None = None
    mfu_inst_estimated_percent: float | None = None
    hfu_estimated_percent: float | None = None
    mbu_estimated_percent: float | None = None
    mm_arithmetic_intensity: float | None = None

    @property
    def total_us(self) -> float:
        return self.total_time_s * 1e6

    def engine_active_s(self, engine: str) -> float | None:
        if engine not in ENGINES:
            raise KernelInputError(f"engine must be one of {ENGINES}, got {engine!r}")
        name = "dma_active_time_s" if engine == "dma" else f"{engine}_engine_active_time_s"
        return getattr(self, name)

    def engine_active_us(self, engine: str) -> float | None:
        value = self.engine_active_s(engine)
        return None if value is None else value * 1e6

    def engine_active_percent(self, engine: str) -> float | None:
        """Share of the kernel's wall time the engine was busy (engines overlap, so these sum past 100)."""
        value = self.engine_active_s(engine)
        return None if value is None else 100.0 * value / self.total_time_s

    def as_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["total_us"] = self.total_us
        for engine in ENGINES:
            doc[f"{engine}_active_us"] = self.engine_active_us(engine)
            doc[f"{engine}_active_percent"] = self.engine_active_percent(engine)
        return doc


# JSON key -> (field name, converter). Engine times keep their JSON name plus "_s".
_FIELDS: dict[str, tuple[str, type]] = {
    "tensor_engine_active_time": ("tensor_engine_active_time_s", float),
    "dma_active_time": ("dma_active_time_s", float),
    "vector_engine_active_time": ("vector_engine_active_time_s", float),
    "scalar_engine_active_time": ("scalar_engine_active_time_s", float),
    "gpsimd_engine_active_time": ("gpsimd_engine_active_time_s", float),
    "sync_engine_active_time": ("sync_engine_active_time_s", float),
}
for _f in fields(ProfileSummary):
    if _f.name not in ("kernel", "config", "total_time_s") and not _f.name.endswith("_time_s"):
        _FIELDS[_f.name] = (_f.name, float if "float" in str(_f.type) else int)


def _number(raw: Any, convert: type, key: str) -> float | int:
    # Summaries have carried numbers both as JSON numbers and as numeric strings.
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ProfileJSONError(f"summary field {key!r} is not a number: {raw!r}") from None
    if not np.isfinite(value):
        raise ProfileJSONError(f"summary field {key!r} is not finite: {raw!r}")
    return int(round(value)) if convert is int else value


def _summary_object(data: Any) -> Mapping[str, Any]:
    if isinstance(data, Mapping) and "summary" in data:  # --output-format json (legacy)
        try:
            summary = data["summary"][0]
        except (IndexError, TypeError, KeyError):
            raise ProfileJSONError("data['summary'] holds no summary object") from None
    elif isinstance(data, Mapping) and data and all(isinstance(v, Mapping) for v in data.values()):
        if len(data) != 1:  # summary-json: one object per profile id
            raise ProfileJSONError(f"{len(data)} profiles in one summary-json ({', '.join(map(str, data))}); "
                                   "view one NEFF/NTFF pair per file")
        summary = next(iter(data.values()))
    else:
        raise ProfileJSONError("neither a summary-json object ({id: {...}}) nor a legacy json profile "
                               "({'summary': [...]}); write it with neuron-explorer view --output-format summary-json")
    if not isinstance(summary, Mapping):
        raise ProfileJSONError("the summary is not an object")
    return summary


def parse_summary(data: Mapping[str, Any], kernel: str, config: str = "") -> ProfileSummary:
    """Build a ProfileSummary from a loaded summary-json or legacy json document."""
    summary = _summary_object(data)
    if "total_time" not in summary:
        raise ProfileJSONError("summary has no 'total_time'")
    total = _number(summary["total_time"], float, "total_time")
    if total <= 0:
        raise ProfileJSONError(f"total_time must be positive, got {total}")
    values: dict[str, Any] = {}
    for key, (name, convert) in _FIELDS.items():
        if summary.get(key) is not None:
            values[name] = _number(summary[key], convert, key)
    return ProfileSummary(kernel=kernel, config=config, total_time_s=total, **values)


def load_summary(path: str | Path, kernel: str | None = None, config: str = "") -> ProfileSummary:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ProfileJSONError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise ProfileJSONError(f"{path}: not valid JSON ({exc})") from None
    try:
        return parse_summary(data, kernel or path.stem, config)
    except ProfileJSONError as exc:
        raise ProfileJSONError(f"{path}: {exc}") from None


def _us(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else "n/a"


def comparison_rows(summaries: list[ProfileSummary]) -> list[dict[str, Any]]:
    """Per config with two or more kernels: fastest vs each slower one, with the speed ratio."""
    rows = []
    by_config: dict[str, list[ProfileSummary]] = {}
    for s in summaries:
        by_config.setdefault(s.config, []).append(s)
    for config, group in by_config.items():
        if len(group) < 2:
            continue
        fastest = min(group, key=lambda s: s.total_time_s)
        for other in group:
            if other is fastest:
                continue
            rows.append(
                {
                    "config": config,
                    "faster": fastest.kernel,
                    "slower": other.kernel,
                    "faster_us": fastest.total_us,
                    "slower_us": other.total_us,
                    "speed_ratio": other.total_time_s / fastest.total_time_s,
                }
            )
    return rows


def _percent(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else "n/a"


def scale_note(summaries: list[ProfileSummary]) -> str:
    """The schema gives utilisations in percent; a first run checks that (a busy kernel at <= 1 % HFU
    would more likely be a fraction)."""
    values = [s.hfu_estimated_percent for s in summaries if s.hfu_estimated_percent]
    if values and max(values) <= 1.0:
        return ("note: every HFU is <= 1; the schema says percent, so either the kernels barely used the "
                "Tensor Engine or this Explorer writes fractions: send the JSON back (docs/kernels.md)")
    return ""


def format_comparison(summaries: list[ProfileSummary]) -> str:
    header = (f"{'Kernel':<12} {'Config':<34} {'Total (μs)':>11} {'Tensor (μs)':>12} {'DMA (μs)':>9} "
              f"{'HFU %':>6} {'MBU %':>6}")
    lines = [header, "-" * len(header)]
    for s in summaries:
        lines.append(
            f"{s.kernel:<12} {s.config:<34} {_us(s.total_us):>11} "
            f"{_us(s.engine_active_us('tensor')):>12} {_us(s.engine_active_us('dma')):>9} "
            f"{_percent(s.hfu_estimated_percent):>6} {_percent(s.mbu_estimated_percent):>6}"
        )
    note = scale_note(summaries)
    if note:
        lines.append(note)
    comparisons = comparison_rows(summaries)
    if comparisons:
        lines += ["", "Comparison:"]
        for row in comparisons:
            lines.append(
                f"- {row['config'] or '(no config)'}: {row['faster']} is {row['speed_ratio']:.2f}x faster "
                f"than {row['slower']} ({row['faster_us']:.2f} vs {row['slower_us']:.2f} μs)"
            )
    return "\n".join(lines)


# --- command lines for the hardware steps (built here, run on a trn2) ------------------------


def explorer_capture_command(neff: str | Path, session: str | Path = "profile.ntff", nth_exec: int = 2) -> list[str]:
    """``neuron-explorer capture`` for a NEFF saved by a torch-xla run with NEURON_FRAMEWORK_DEBUG=1."""
    return ["neuron-explorer", "capture", "-n", str(neff), "-s", str(session), f"--profile-nth-exec={nth_exec}"]


FRAMEWORK_DEBUG_ENV = {"NEURON_FRAMEWORK_DEBUG": "1", "XLA_IR_DEBUG": "1", "XLA_HLO_DEBUG": "1"}
