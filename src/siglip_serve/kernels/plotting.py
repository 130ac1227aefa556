"""PNG plots of matmul results (matplotlib, headless Agg backend)."""
from __future__ import annotations

from pathlib import Path

from siglip_serve.kernels.errors import KernelInputError
from siglip_serve.kernels.matmul_profiler import MatmulResult


def plot_matmul(results: list[MatmulResult], path: str | Path, title: str = "") -> Path:
    """Left: p50 latency against tile count (tiling cost). Right: TFLOP/s per shape."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not results:
        raise KernelInputError("nothing to plot")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (ax_lat, ax_tput) = plt.subplots(1, 2, figsize=(13, 5))
    tiles = [r.total_tiles for r in results]
    ax_lat.scatter(tiles, [r.latency_p50_ms for r in results], c="tab:blue")
    ax_lat.set_xlabel("total tiles (nc_matmul instructions)")
    ax_lat.set_ylabel("p50 latency (ms)")
    ax_lat.set_xscale("log")
    ax_lat.set_yscale("log")
    ax_lat.grid(True, which="both", alpha=0.3)

    labels = [f"{r.M}x{r.K}x{r.N}" for r in results]
    ax_tput.bar(range(len(results)), [r.tflops_at_p50 for r in results], color="tab:orange")
    ax_tput.set_xticks(range(len(results)))
    ax_tput.set_xticklabels(labels, rotation=75, fontsize=7)
    ax_tput.set_ylabel("TFLOP/s at p50")
    devices = sorted({r.device for r in results})
    fig.suptitle(title or f"matmul on {', '.join(devices)} ({results[0].dtype})")
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)
    return path
