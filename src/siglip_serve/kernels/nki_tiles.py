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


def my_span(extent):
    """(start, stop) of this program's contiguous, near-equal share of an axis: all of it at LNC=1, halves
    at LNC=2 (SigLIP's 729 tokens: 365 and 364). Whole tiles dealt round-robin would give one program
    512 tokens and the other 217, so the pair could reach at best 70% of the roofline."""
    programs = nl.num_programs(0)
    me = nl.program_id(0)
    base = extent // programs
    extra = extent % programs
    start = me * base + min(me, extra)
    stop = start + base
    if me < extra:
        stop = stop + 1
    return start, stop


def my_span_tiles(extent, size):
    """(start, stop) tiles of at most ``size`` covering this program's span (``my_span``)."""
    start, stop = my_span(extent)
    owned = []
    for t in range(start, stop, size):
        owned.append((t, min(stop, t + size)))
    return owned


def load_tile(src, r0, r1, c0, c1, dtype=None):
    """``src[r0:r1, c0:c1]`` copied into a new SBUF tile, in ``dtype`` (default: src's).

    The DMA copies in the source dtype and an engine converts: the hardware DGE moves raw bytes and
    does no type casting (NKI 0.3.0 migration guide), and the compiler may pick it (dge_mode.unknown).
    """
    tile = nl.ndarray((r1 - r0, c1 - c0), dtype=src.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=src[r0:r1, c0:c1])
    if dtype is None or dtype == src.dtype:
        return tile
    converted = nl.ndarray((r1 - r0, c1 - c0), dtype=dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=converted, src=tile)
    return converted


def load_tiles(src, rows, c0, c1, dtype=None):
    """``src[0:rows, c0:c1]`` as SBUF tiles of up to 128 partitions each (the last may be ragged), in
    row order: the resident weights and the per-token-tile activations of the transposed kernels."""
    pmax = nl.tile_size.pmax
    tiles = []
    for k in range((rows + pmax - 1) // pmax):
        r0 = k * pmax
        tiles.append(load_tile(src, r0, min(rows, r0 + pmax), c0, c1, dtype))
    return tiles
