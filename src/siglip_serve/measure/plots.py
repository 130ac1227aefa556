"""The report's figures (matplotlib Agg, PNG). Every figure's subtitle names the machine, backend,
model, LNC and buckets the numbers come from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after choosing the headless backend
from matplotlib.ticker import MaxNLocator

from siglip_serve.measure.load_results import OperatingPoint, Step
from siglip_serve.measure.results import MulticoreWorker


def _finish(fig: Any, ax: Any, title: str, context: str, path: Path) -> Path:
    ax.set_title(f"{title}\n{context}", fontsize=9)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def throughput_vs_users(steps: list[Step], saturation: OperatingPoint | None,
                        multicore_total: float | None, seed_instance: float | None, context: str,
                        path: Path) -> Path | None:
    if not steps:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    users = [s.users for s in steps]
    ax.plot(users, [s.images_per_second for s in steps], marker="o", label="served (load test)")
    if saturation and saturation.users is not None:
        ax.scatter([saturation.users], [saturation.images_per_second], s=120, facecolors="none",
                   edgecolors="red", zorder=3, label=f"saturation {saturation.images_per_second:.1f} img/s")
    if multicore_total:
        ax.axhline(multicore_total, color="green", linestyle="--", label=f"bare, all cores {multicore_total:.1f}")
    if seed_instance:
        ax.axhline(seed_instance, color="gray", linestyle=":", label=f"seed 000 instance {seed_instance:g}")
    ax.set_xlabel("concurrent users")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))  # users are whole: no 1.5-user ticks
    ax.set_ylabel("images / s")
    ax.set_ylim(bottom=0)
    return _finish(fig, ax, "Throughput vs users", context, path)


def latency_vs_users(steps: list[Step], p99_target_ms: float | None, context: str,
                     path: Path) -> Path | None:
    if not steps:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    users = [s.users for s in steps]
    for q, style in (("p50", "o-"), ("p95", "s-"), ("p99", "^-")):
        values = [getattr(s.latency_ms, q) for s in steps]
        ax.plot(users, [v if v is not None else float("nan") for v in values], style, label=q)
    if p99_target_ms:
        ax.axhline(p99_target_ms, color="red", linestyle="--", label=f"p99 target {p99_target_ms:g} ms")
    ax.set_xlabel("concurrent users")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))  # users are whole: no 1.5-user ticks
    ax.set_ylabel("request latency (ms)")
    ax.set_ylim(bottom=0)
    return _finish(fig, ax, "Latency percentiles vs users", context, path)


def per_core_bars(per_core: list[MulticoreWorker], single_core: float | None, seed_per_core: float | None,
                  context: str, path: Path) -> Path | None:
    labels = [f"core {w.core}" for w in per_core]
    values = [w.images_per_second for w in per_core]
    if single_core is not None:
        labels.insert(0, "single core\n(bare, batch 1)")
        values.insert(0, single_core)
    if not values:
        return None
    fig, ax = plt.subplots(figsize=(max(5.0, 0.8 * len(values) + 2), 4.2))
    colors = ["tab:orange" if single_core is not None and i == 0 else "tab:blue" for i in range(len(values))]
    bars = ax.bar(labels, values, color=colors)
    ax.bar_label(bars, fmt="%.1f", fontsize=8)
    if seed_per_core:
        ax.axhline(seed_per_core, color="gray", linestyle=":", label=f"seed 000 per core {seed_per_core:g}")
    ax.set_ylabel("images / s")
    ax.set_ylim(bottom=0)
    ax.tick_params(axis="x", labelsize=8)
    return _finish(fig, ax, "Per-core throughput (one worker per logical core)", context, path)
