"""Compile-once cache with a guard that proves a timed call did not recompile.

Seed 002's pitfall: an ``@nki.jit`` kernel dispatched through torch-xla recompiled
on every call, so a 45 us kernel "took" ~4 s. Two counters catch that:

* the cache's own count of compilations (a miss on the (shape, dtype, path) key), and
* optionally a backend counter (torch-xla's ``CompileTime`` metric on Neuron) that
  sees compilations the cache cannot, e.g. a compiled callable that recompiles inside.

``guard()`` snapshots both and raises :class:`RecompileError` if either moved.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from siglip_serve.kernels.device import RecompileError


@dataclass(frozen=True)
class CacheKey:
    shape: tuple[int, ...]
    dtype: str
    path: str


@dataclass(frozen=True)
class CompiledKernel:
    key: CacheKey
    fn: Callable[..., Any]
    compile_time_s: float


class CompileCache:
    def __init__(
        self,
        compile_fn: Callable[[CacheKey], Callable[..., Any]],
        backend_compile_count: Callable[[], int | None] = lambda: None,
    ) -> None:
        self._compile_fn = compile_fn
        self._backend_compile_count = backend_compile_count
        self._entries: dict[CacheKey, CompiledKernel] = {}
        self.compilations = 0

    def __contains__(self, key: CacheKey) -> bool:
        return key in self._entries

    def get(self, key: CacheKey) -> CompiledKernel:
        """Return the compiled kernel for ``key``, compiling (and timing the compile) on a miss."""
        entry = self._entries.get(key)
        if entry is None:
            start = time.perf_counter()
            fn = self._compile_fn(key)
            entry = CompiledKernel(key, fn, time.perf_counter() - start)
            self._entries[key] = entry
            self.compilations += 1
        return entry

    def _snapshot(self) -> tuple[int, int | None]:
        return self.compilations, self._backend_compile_count()

    @contextmanager
    def guard(self, what: str = "timed region") -> Iterator[None]:
        """Raise RecompileError if anything compiled inside the ``with`` block."""
        before = self._snapshot()
        yield
        after = self._snapshot()
        if after[0] != before[0]:
            raise RecompileError(f"{what}: the cache compiled {after[0] - before[0]} kernel(s)")
        if before[1] is not None and after[1] is not None and after[1] != before[1]:
            raise RecompileError(
                f"{what}: the backend compiled {after[1] - before[1]} graph(s); "
                "each call is paying compile time (seed 002's recompile-every-call pitfall)"
            )
