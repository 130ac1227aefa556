"""The tiling steps every NKI kernel here repeats: which tiles of an outer loop this program of an
LNC launch owns, and loading HBM slices into SBUF tiles of at most 128 partitions.

Imported only by the kernel modules (:mod:`siglip_serve.kernels.nki_kernels`, :mod:`siglip_serve.kernels.nki_siglip`),
themselves imported lazily once a real ``nki`` is present. A kernel calls them as plain functions
from another module, as nki-library's kernels do (mlp_cte.py loads and stores through
mlp_cte_tensor_io.py); they use loops and lists only, no generators or comprehensions.
"""
import nki.isa as nisa
import nki.language as nl


def my_share(steps):
    """The steps of an outer loop that this program of the LNC launch owns: program k of n takes
    k, k+n, k+2n, ... (``nl.program_id(0)`` / ``nl.num_programs(0)`` are plain ints while tracing).
    At LNC=1 the single program takes every step."""
    return range(nl.program_id(0), steps, nl.num_programs(0))


def my_tiles(extent, size):
    """(start, stop) of each ``size``-wide tile along an axis of ``extent`` that this program owns;
    the last tile may be ragged. Empty when there are more programs than tiles."""
    owned = []
    for t in my_share((extent + size - 1) // size):
        start = t * size
        owned.append((start, min(extent, start + size)))
    return owned


def load_tile(src, r0, r1, c0, c1, dtype=None):
    """``src[r0:r1, c0:c1]`` copied into a new SBUF tile, in ``dtype`` (default: src's; the DMA casts)."""
    tile = nl.ndarray((r1 - r0, c1 - c0), dtype=src.dtype if dtype is None else dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=src[r0:r1, c0:c1])
    return tile


def load_tiles(src, rows, c0, c1, dtype=None):
    """``src[0:rows, c0:c1]`` as SBUF tiles of up to 128 partitions each (the last may be ragged), in
    row order: the resident weights and the per-token-tile activations of the transposed kernels."""
    pmax = nl.tile_size.pmax
    tiles = []
    for k in range((rows + pmax - 1) // pmax):
        r0 = k * pmax
        tiles.append(load_tile(src, r0, min(rows, r0 + pmax), c0, c1, dtype))
    return tiles
