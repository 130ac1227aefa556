"""CUDA paths of the benchmarks: run where torch sees a GPU, skipped elsewhere."""
from __future__ import annotations

import numpy as np
import pytest

from siglip_serve.kernels import matmul_profiler as mp
from siglip_serve.kernels import references
from siglip_serve.kernels.device import resolve_device
from siglip_serve.kernels.mlp import MLPConfig, benchmark_mlp, make_inputs
from siglip_serve.kernels.tiling import MatmulConfig

pytestmark = pytest.mark.cuda


def test_matmul_profiler_on_cuda_uses_events():
    device = resolve_device("cuda")
    shapes = [mp.Shape(MatmulConfig(m, 1024, 1024), "cuda") for m in (128, 129)]
    results = mp.profile_all(shapes, device, dtype="float16", warmup=3, iterations=10)
    for r in results:
        assert r.device == "cuda" and 0 < r.latency_p50_ms <= r.latency_p99_ms and r.tflops_at_p50 > 0
        assert r.timing == "device"  # CUDA events time the stream, not host dispatch


def test_mlp_compiler_path_on_cuda():
    cfg = MLPConfig(1, 64, 256, 512)
    result = benchmark_mlp(cfg, resolve_device("cuda"), "compiler", "float32", warmup=2, iterations=10)
    assert result.kernel == "torch-cuda" and result.compilations == 1 and result.timing == "device"
    scale = float(np.abs(references.gated_mlp(**make_inputs(cfg))).max())
    assert result.max_abs_err < 1e-2 * max(scale, 1.0)  # TF32 matmuls may be enabled
