"""Timed loops on a lazy device: the timed work must really run, and its result is checked once.

The double below models what matters about torch-xla here: work is only executed at a sync,
and only for results still referenced then. It does not model compilation, real timing, or
device memory; the neuron-marked tests run the real thing.
"""
from __future__ import annotations

import weakref

import numpy as np
import pytest
import torch

from siglip_serve.kernels import matmul_profiler as mp
from siglip_serve.kernels import nki_launch
from siglip_serve.kernels.compile_cache import CompileCache
from siglip_serve.kernels.device import Device, ResultMismatch
from siglip_serve.kernels.mlp import MLPConfig, benchmark_mlp
from siglip_serve.kernels.tiling import MatmulConfig


class LazyRuntime:
    """Records results as pending work; a sync executes (counts) those still referenced."""

    def __init__(self) -> None:
        self.pending: list[weakref.ref] = []
        self.executed = 0
        self.syncs = 0

    def track(self, result):
        self.pending.append(weakref.ref(result))
        return result

    def sync(self) -> None:
        self.syncs += 1
        self.executed += sum(1 for ref in self.pending if ref() is not None)
        self.pending.clear()


@pytest.fixture
def lazy():
    runtime = LazyRuntime()
    device = Device("neuron", torch.device("cpu"), "lazy double", runtime.sync, lambda: 0)
    return runtime, device


def test_the_double_drops_work_whose_result_is_gone_before_the_sync(lazy):
    runtime, device = lazy
    runtime.track(torch.ones(3))  # the old loop: call, drop the result, then sync
    device.synchronize()
    assert runtime.executed == 0


def test_time_calls_runs_every_timed_call_and_checks_the_last_result_once(lazy):
    runtime, device = lazy
    seen = []
    calls = iter(range(100))
    samples = device.time_calls(lambda: runtime.track(torch.full((2,), float(next(calls)))), 5, check=seen.append)
    assert len(samples) == 5 and runtime.executed == 5
    assert len(seen) == 1 and seen[0].tolist() == [4.0, 4.0]


def test_run_synced_keeps_the_result_across_the_sync(lazy):
    runtime, device = lazy
    out = device.run_synced(lambda: runtime.track(torch.zeros(1)))
    assert runtime.executed == 1 and out.shape == (1,)


def test_matmul_profile_runs_first_call_warmup_and_timed_calls(lazy, monkeypatch):
    runtime, device = lazy
    real = torch.matmul
    monkeypatch.setattr(torch, "matmul", lambda a, b: runtime.track(real(a, b)))
    result = mp.profile_matmul(mp.Shape(MatmulConfig(8, 16, 4), "t"), device, dtype="float32",
                               warmup=3, iterations=4, lnc=2)
    assert runtime.executed == 3 + 4  # first call + 2 more warm-ups + 4 timed
    assert result.iterations == 4 and result.timing == "wall_clock_including_dispatch"


def test_matmul_profile_refuses_a_wrong_timed_result(lazy, monkeypatch):
    runtime, device = lazy
    real = torch.matmul
    monkeypatch.setattr(torch, "matmul", lambda a, b: runtime.track(real(a, b) + 1.0))
    with pytest.raises(ResultMismatch, match="first row is off"):
        mp.profile_matmul(mp.Shape(MatmulConfig(8, 16, 4), "t"), device, dtype="float32", warmup=1,
                          iterations=2, lnc=2)


def test_nki_hardware_loop_runs_every_call_and_checks_against_the_reference(lazy):
    runtime, device = lazy
    a = np.arange(256, dtype=np.float32)
    run = nki_launch.prepare_vector_add_tiled(a, a, 128)
    out, timing = nki_launch.time_kernel(run, lambda x, y, chunk: runtime.track(x + y), device,
                                         warmup=2, iterations=4)
    assert runtime.executed == 2 + 4
    np.testing.assert_array_equal(out, 2 * a)
    assert timing.timing == "wall_clock_including_dispatch" and timing.iterations == 4
    with pytest.raises(ResultMismatch, match="timed calls returned a wrong result"):
        nki_launch.time_kernel(run, lambda x, y, chunk: runtime.track(x - y), device, warmup=1, iterations=2)


def test_mlp_benchmark_runs_warmup_and_timed_calls(lazy):
    runtime, _ = lazy
    device = Device("cpu", torch.device("cpu"), "lazy cpu double", runtime.sync)
    cfg = MLPConfig(1, 4, 16, 8)

    def compile_fn(key):
        w = torch.zeros(16, 16)
        return lambda x: runtime.track(x @ w)

    result = benchmark_mlp(cfg, device, "compiler", "float32", warmup=2, iterations=3, lnc=1,
                           cache=CompileCache(compile_fn))
    assert runtime.executed == 2 + 3
    assert result.max_abs_err > 0  # the zero "MLP" is wrong, and the error of the timed result says so
