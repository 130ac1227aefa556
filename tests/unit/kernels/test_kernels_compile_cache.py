"""The compile-once cache and its recompile guard (seed 002's 4-second pitfall), on CPU."""
from __future__ import annotations

import pytest
import torch

from siglip_serve.kernels.compile_cache import CacheKey, CompileCache
from siglip_serve.kernels.device import RecompileError, resolve_device
from siglip_serve.kernels.mlp import MLPConfig, benchmark_mlp, make_compile_fn, make_inputs


def test_compiles_once_per_key():
    calls = []
    cache = CompileCache(lambda key: (calls.append(key), lambda x: x * 2)[1])
    key = CacheKey((4, 8), "float32", "compiler")
    first = cache.get(key)
    for _ in range(5):
        assert cache.get(key) is first
    assert cache.compilations == 1 and calls == [key]
    assert first.fn(3) == 6 and first.compile_time_s >= 0
    cache.get(CacheKey((4, 8), "bfloat16", "compiler"))
    cache.get(CacheKey((4, 8), "float32", "nki"))
    assert cache.compilations == 3


def test_guard_catches_a_cache_miss_inside_the_timed_region():
    cache = CompileCache(lambda key: lambda: None)
    with pytest.raises(RecompileError, match="cache compiled 1"):
        with cache.guard("timed"):
            cache.get(CacheKey((1,), "float32", "compiler"))


def test_guard_catches_a_compiled_callable_that_recompiles_every_call():
    backend = {"compiles": 0}

    def leaky_compile(key):
        # Looks compiled, but every call recompiles underneath, like @nki.jit under torch-xla in seed 002.
        def call(x):
            backend["compiles"] += 1
            return x

        return call

    cache = CompileCache(leaky_compile, backend_compile_count=lambda: backend["compiles"])
    kernel = cache.get(CacheKey((2,), "float32", "nki"))
    with pytest.raises(RecompileError, match="backend compiled 3"):
        with cache.guard("timed"):
            for _ in range(3):
                kernel.fn(1)


def test_guard_passes_when_nothing_compiles():
    backend = {"compiles": 7}
    cache = CompileCache(lambda key: lambda: 1, backend_compile_count=lambda: backend["compiles"])
    kernel = cache.get(CacheKey((1,), "float32", "compiler"))
    with cache.guard():
        assert [kernel.fn() for _ in range(3)] == [1, 1, 1]


def test_torch_jit_trace_path_compiles_once_across_repeated_benchmarks():
    device = resolve_device("cpu")
    cfg = MLPConfig(1, 8, 32, 48)
    traced = []
    real_compile = make_compile_fn(device, make_inputs(cfg), lnc=1)

    def counting_compile(key):
        traced.append(key)
        return real_compile(key)

    cache = CompileCache(counting_compile, device.compile_count)
    first = benchmark_mlp(cfg, device, "compiler", "float32", warmup=1, iterations=3, cache=cache)
    second = benchmark_mlp(cfg, device, "compiler", "float32", warmup=1, iterations=3, cache=cache)
    assert len(traced) == 1 and cache.compilations == 1
    assert first.compile_ms > 0 and second.compile_ms == 0.0  # the second run reused the trace
    assert isinstance(cache.get(traced[0]).fn, torch.jit.ScriptModule)
