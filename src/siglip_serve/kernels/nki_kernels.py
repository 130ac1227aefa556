"""NKI kernels for the top-level ``nki`` package (NKI 0.2+, Neuron SDK 2.27+).

This module imports ``nki`` at load time because the NKI compiler resolves the
``nl``/``nisa`` globals of the kernel's module; therefore it is only ever imported
lazily, by :mod:`siglip_serve.kernels.nki_launch`, once a real ``nki`` is known to be present.

Kernels are plain functions; the launcher applies ``nki.jit`` at the call site
(the NKI 0.2 migration guide's advice for kernels that may also be called from
other kernels). Shapes are checked by ``siglip_serve.kernels.nki_launch`` *before* compiling,
so the asserts here are a second line of defence, not the user-facing errors.

Layout conventions (what the launcher prepares on the host):
* vector_add_tiled: vectors as ``[N, 1]`` so ROW_CHUNK elements land on ROW_CHUNK partitions.
* vector_add_stream: vectors as ``[128, N/128]`` streamed FREE_DIM columns at a time.
* conv2d_bias_maxpool: weights pre-arranged as ``[C_in, FH*FW*C_out]`` (stationary layout).
* gated_mlp_t: activations transposed, ``xT [hidden, tokens]``; returns ``outT``.

LNC: every kernel is launched at the Neuron runtime's LNC (``kernel[2]`` on a default trn2) and
splits its outermost independent loop between the programs of the launch with
:func:`siglip_serve.kernels.nki_tiles.my_share`: program k of n takes steps k, k+n, k+2n, ...
(``nl.program_id(0)`` / ``nl.num_programs(0)`` are plain ints while a kernel is traced, as
nki-library's LNC kernels use them). At LNC=1 the single program takes every step.
"""
import nki.isa as nisa
import nki.language as nl

from siglip_serve.kernels.nki_tiles import load_tiles, my_share, my_tiles


def vector_add_tiled(a, b, row_chunk):
    """c = a + b, ROW_CHUNK elements per step, one element per partition (seed 003 step 1)."""
    n = a.shape[0]
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    for i in my_share(n // row_chunk):
        a_t = nl.ndarray((row_chunk, 1), dtype=a.dtype, buffer=nl.sbuf)
        b_t = nl.ndarray((row_chunk, 1), dtype=b.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=a_t, src=a[i * row_chunk:(i + 1) * row_chunk, 0:1])
        nisa.dma_copy(dst=b_t, src=b[i * row_chunk:(i + 1) * row_chunk, 0:1])
        c_t = nl.ndarray((row_chunk, 1), dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=c_t, data1=a_t, data2=b_t, op=nl.add)
        nisa.dma_copy(dst=out[i * row_chunk:(i + 1) * row_chunk, 0:1], src=c_t)
    return out


def vector_add_stream(a, b, free_dim):
    """c = a + b on [128, M] views, FREE_DIM columns per DMA so loads overlap the adds (step 2)."""
    parts, cols = a.shape
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    for i in my_share(cols // free_dim):
        a_t = nl.ndarray((parts, free_dim), dtype=a.dtype, buffer=nl.sbuf)
        b_t = nl.ndarray((parts, free_dim), dtype=b.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=a_t, src=a[0:parts, i * free_dim:(i + 1) * free_dim])
        nisa.dma_copy(dst=b_t, src=b[0:parts, i * free_dim:(i + 1) * free_dim])
        c_t = nl.ndarray((parts, free_dim), dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=c_t, data1=a_t, data2=b_t, op=nl.add)
        nisa.dma_copy(dst=out[0:parts, i * free_dim:(i + 1) * free_dim], src=c_t)
    return out


def transpose2d(x):
    """out = x.T through the Tensor Engine, 128x128 blocks (ragged edges allowed)."""
    rows, cols = x.shape
    pmax = nl.tile_size.pmax
    out = nl.ndarray((cols, rows), dtype=x.dtype, buffer=nl.shared_hbm)
    for r0, r1 in my_tiles(rows, pmax):
        for j in range((cols + pmax - 1) // pmax):
            c0 = j * pmax
            c1 = min(cols, c0 + pmax)
            blk = nl.ndarray((r1 - r0, c1 - c0), dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=blk, src=x[r0:r1, c0:c1])
            blk_t_psum = nl.ndarray((c1 - c0, r1 - r0), dtype=x.dtype, buffer=nl.psum)
            nisa.nc_transpose(dst=blk_t_psum, data=blk)
            blk_t = nl.ndarray((c1 - c0, r1 - r0), dtype=x.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=blk_t, src=blk_t_psum)
            nisa.dma_copy(dst=out[c0:c1, r0:r1], src=blk_t)
    return out


def conv2d_bias_maxpool(x, w_t, bias, fh, fw, pool):
    """maxpool(conv2d(x, w) + bias), stride-1 'valid' conv, pool = kernel = stride (seed 003 part 2).

    x [B, C_in, H, W]; w_t [C_in, fh*fw*C_out] with w_t[ci, (i*fw+j)*C_out + co] = w[co, ci, i, j];
    bias [C_out, 1]. Channels are tiled by 128 (partition limit). Each conv output row is
    fh*fw*ceil(C_in/128) matmuls accumulated in PSUM; weights are loaded once, outside all
    loops (the write-up's biggest win); bias is added after pooling, once per pooled value.
    """
    batch, c_in, height, width = x.shape
    c_out = bias.shape[0]
    pmax = nl.tile_size.pmax
    out_h = height - fh + 1
    out_w = width - fw + 1
    pooled_h = out_h // pool
    pooled_w = out_w // pool
    conv_w = pooled_w * pool  # conv columns that survive pooling
    n_ci = (c_in + pmax - 1) // pmax
    n_co = (c_out + pmax - 1) // pmax
    out = nl.ndarray((batch, c_out, pooled_h, pooled_w), dtype=x.dtype, buffer=nl.shared_hbm)

    w_tiles = load_tiles(w_t, c_in, 0, fh * fw * c_out)
    # tensor_scalar's per-partition operand must be float32; the DMA casts the bias to it.
    bias_tiles = load_tiles(bias, c_out, 0, 1, nl.float32)

    for job in my_share(batch * pooled_h):
        b, py = divmod(job, pooled_h)
        # The pool+fh-1 input rows that feed this band of `pool` conv rows.
        rows = []
        for ci in range(n_ci):
            ci0 = ci * pmax
            ci1 = min(c_in, ci0 + pmax)
            ci_rows = []
            for r in range(pool + fh - 1):
                row = nl.ndarray((ci1 - ci0, width), dtype=x.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=row, src=x[b, ci0:ci1, py * pool + r, 0:width])
                ci_rows.append(row)
            rows.append(ci_rows)
        for co in range(n_co):
            co0 = co * pmax
            co1 = min(c_out, co0 + pmax)
            band_max = nl.ndarray((co1 - co0, conv_w), dtype=nl.float32, buffer=nl.sbuf)
            for r in range(pool):
                acc = nl.ndarray((co1 - co0, conv_w), dtype=nl.float32, buffer=nl.psum)
                for ci in range(n_ci):
                    ci_len = min(c_in, ci * pmax + pmax) - ci * pmax
                    for i in range(fh):
                        for j in range(fw):
                            tap = (i * fw + j) * c_out
                            nisa.nc_matmul(
                                dst=acc,
                                stationary=w_tiles[ci][0:ci_len, tap + co0:tap + co1],
                                moving=rows[ci][r + i][0:ci_len, j:j + conv_w],
                            )
                if r == 0:
                    nisa.tensor_copy(dst=band_max, src=acc)
                else:
                    nisa.tensor_tensor(dst=band_max, data1=band_max, data2=acc, op=nl.maximum)
            # Horizontal pooling: max over the `pool` interleaved column phases.
            pooled = nl.ndarray((co1 - co0, pooled_w), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=pooled, src=band_max[0:co1 - co0, 0:conv_w:pool])
            for q in range(1, pool):
                nisa.tensor_tensor(dst=pooled, data1=pooled,
                                   data2=band_max[0:co1 - co0, q:conv_w:pool], op=nl.maximum)
            res = nl.ndarray((co1 - co0, pooled_w), dtype=x.dtype, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=res, data=pooled, op0=nl.add, operand0=bias_tiles[co])
            nisa.dma_copy(dst=out[b, co0:co1, py, 0:pooled_w], src=res)
    return out


def tensor_add_spmd(a, b):
    """c = a + b with rows split across the programs of an LNC launch (seed 004).

    Launched at the runtime's LNC (``kernel[2]`` on a default trn2), program k of n owns the
    contiguous rows [k*R/n, (k+1)*R/n), in [128, 512] tiles; the current-API equivalent of
    ``kernel[nl.spmd_dim(grid_x, nl.nc(2)), grid_y]``. Both cores write the same
    shared-HBM output. At LNC=1 one program owns every row.
    """
    rows, cols = a.shape
    pmax = nl.tile_size.pmax
    fmax = 512
    n_prog = nl.num_programs(0)
    rows_per_prog = rows // n_prog
    row_base = nl.program_id(0) * rows_per_prog
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    for t in range(rows_per_prog // pmax):
        r0 = row_base + t * pmax
        for f in range((cols + fmax - 1) // fmax):
            c0 = f * fmax
            c1 = min(cols, c0 + fmax)
            a_t = nl.ndarray((pmax, c1 - c0), dtype=a.dtype, buffer=nl.sbuf)
            b_t = nl.ndarray((pmax, c1 - c0), dtype=b.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=a_t, src=a[r0:r0 + pmax, c0:c1])
            nisa.dma_copy(dst=b_t, src=b[r0:r0 + pmax, c0:c1])
            c_t = nl.ndarray((pmax, c1 - c0), dtype=a.dtype, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=c_t, data1=a_t, data2=b_t, op=nl.add)
            nisa.dma_copy(dst=out[r0:r0 + pmax, c0:c1], src=c_t)
    return out


def gated_mlp_t(x_t, w_gate, w_up, w_down):
    """outT = ((silu(x @ Wg) * (x @ Wu)) @ Wd).T from xT [H, T]; Wg, Wu [H, I]; Wd [I, H].

    Working transposed keeps every matmul in nc_matmul's native form: the weights are the
    stationary operand (<=128x128 slices, contraction on partitions) and the tokens stream
    as the moving operand, 512 at a time. The intermediate hT [I, T] never leaves SBUF.
    H and I must be multiples of 128 (checked by the launcher).
    """
    hidden, tokens = x_t.shape
    inter = w_gate.shape[1]
    pmax = nl.tile_size.pmax
    tmax = nl.tile_size.gemm_moving_fmax
    n_h = hidden // pmax
    n_i = inter // pmax
    out_t = nl.ndarray((hidden, tokens), dtype=x_t.dtype, buffer=nl.shared_hbm)
    my_token_tiles = my_tiles(tokens, tmax)
    if not my_token_tiles:  # more programs than token tiles: this one has nothing to do
        return out_t

    # Weights stay resident for all of this program's token tiles.
    wg_tiles = load_tiles(w_gate, hidden, 0, inter)
    wu_tiles = load_tiles(w_up, hidden, 0, inter)
    wd_tiles = load_tiles(w_down, inter, 0, hidden)

    for t0, t1 in my_token_tiles:
        x_tiles = load_tiles(x_t, hidden, t0, t1)
        h_tiles = []
        for m in range(n_i):
            gate = nl.ndarray((pmax, t1 - t0), dtype=nl.float32, buffer=nl.psum)
            up = nl.ndarray((pmax, t1 - t0), dtype=nl.float32, buffer=nl.psum)
            for k in range(n_h):
                nisa.nc_matmul(dst=gate, stationary=wg_tiles[k][0:pmax, m * pmax:(m + 1) * pmax],
                               moving=x_tiles[k])
                nisa.nc_matmul(dst=up, stationary=wu_tiles[k][0:pmax, m * pmax:(m + 1) * pmax],
                               moving=x_tiles[k])
            gate_act = nl.ndarray((pmax, t1 - t0), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(dst=gate_act, op=nl.silu, data=gate)
            h = nl.ndarray((pmax, t1 - t0), dtype=x_t.dtype, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=h, data1=gate_act, data2=up, op=nl.multiply)
            h_tiles.append(h)
        for m in range(n_h):
            acc = nl.ndarray((pmax, t1 - t0), dtype=nl.float32, buffer=nl.psum)
            for k in range(n_i):
                nisa.nc_matmul(dst=acc, stationary=wd_tiles[k][0:pmax, m * pmax:(m + 1) * pmax],
                               moving=h_tiles[k])
            o = nl.ndarray((pmax, t1 - t0), dtype=x_t.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=o, src=acc)
            nisa.dma_copy(dst=out_t[m * pmax:(m + 1) * pmax, t0:t1], src=o)
    return out_t
