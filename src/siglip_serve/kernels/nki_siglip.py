"""NKI kernels for the three SigLIP-SO400M/14-384 hot spots: LayerNorm, the MLP, the attention softmax.

Like :mod:`siglip_serve.kernels.nki_kernels` this imports ``nki`` at load time and is only imported lazily
by the launcher. Shapes are validated by :mod:`siglip_serve.kernels.siglip` before anything compiles.
Each kernel splits its outer loop between the programs of an LNC launch, and loads its tiles,
through :mod:`siglip_serve.kernels.nki_tiles` as the kernels of :mod:`siglip_serve.kernels.nki_kernels` do.

* ``layer_norm``: tokens on partitions, 128 per tile, the 1152 features on the free axis;
  mean and variance by free-axis reductions, 1/sqrt(var + eps) on GpSimd (one value per partition);
  gamma/beta broadcast to all partitions once with a K=1 matmul (ones[1, 128].T @ row), so they
  are read from HBM once.
* ``mlp_gelu_t``: ``fc2(gelu_tanh(fc1(x) + b1)) + b2`` in the transposed layout of
  ``gated_mlp_t`` (features on partitions, tokens streaming 512 at a time; at LNC=2 each program
  takes a contiguous half of the tokens). The intermediate
  4304 = 33 x 128 + 80, so the last hidden tile has 80 partitions; bias + GELU are one
  Scalar-Engine ``activation`` reading PSUM, and fc2 contracts over the ragged tile too.
* ``softmax_rows``: ``softmax(scale * s)`` over the last axis of attention scores [rows, 729],
  128 rows per tile: row max, ``exp(scale*s - scale*max)`` fused in one ``activation``, row sum,
  the ``[rows, 1]`` reciprocal on VectorE, multiply.
"""
import nki.isa as nisa
import nki.language as nl

from siglip_serve.kernels.nki_tiles import load_tile, load_tiles, my_span_tiles, my_tiles


def _broadcast_row(row, width, ones):
    """A [1, width] float32 SBUF row copied onto all 128 partitions (ones.T @ row, 512 columns at a time)."""
    pmax = nl.tile_size.pmax
    fmax = nl.tile_size.gemm_moving_fmax
    out = nl.ndarray((pmax, width), dtype=nl.float32, buffer=nl.sbuf)
    for c in range((width + fmax - 1) // fmax):
        c0 = c * fmax
        c1 = min(width, c0 + fmax)
        acc = nl.ndarray((pmax, c1 - c0), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=ones, moving=row[0:1, c0:c1])
        nisa.tensor_copy(dst=out[0:pmax, c0:c1], src=acc)
    return out


def layer_norm(x, gamma, beta, eps):
    """y = (x - mean) / sqrt(var + eps) * gamma + beta over the last axis; x [T, D], gamma/beta [1, D]."""
    tokens, width = x.shape
    pmax = nl.tile_size.pmax
    out = nl.ndarray((tokens, width), dtype=x.dtype, buffer=nl.shared_hbm)
    my_row_tiles = my_tiles(tokens, pmax)
    if not my_row_tiles:
        return out

    ones = nl.ndarray((1, pmax), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    rows_f32 = []
    for vec in (gamma, beta):
        rows_f32.append(_broadcast_row(load_tile(vec, 0, 1, 0, width, nl.float32), width, ones))
    gamma_b, beta_b = rows_f32

    for r0, r1 in my_row_tiles:
        rows = r1 - r0
        xt = load_tile(x, r0, r1, 0, width)
        total = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=total, op=nl.add, data=xt, axis=1, keepdims=True)
        mean = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=mean, data=total, op0=nl.multiply, operand0=1.0 / width)
        xc = nl.ndarray((rows, width), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=xc, data=xt, op0=nl.subtract, operand0=mean)
        sq = nl.ndarray((rows, width), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=sq, data1=xc, data2=xc, op=nl.multiply)
        var = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=var, op=nl.add, data=sq, axis=1, keepdims=True)
        nisa.tensor_scalar(dst=var, data=var, op0=nl.multiply, operand0=1.0 / width, op1=nl.add, operand1=eps)
        rstd = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        # One value per partition: GpSimd's rsqrt is more precise than ScalarE's piecewise one, and its 4x lower
        # throughput costs nothing at one element (nki.api.shared, "NKI Engine Selection").
        nisa.tensor_scalar(dst=rstd, data=var, op0=nl.rsqrt, operand0=0.0, engine=nisa.engine.gpsimd)
        y = nl.ndarray((rows, width), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=y, data=xc, op0=nl.multiply, operand0=rstd)
        nisa.tensor_tensor(dst=y, data1=y, data2=gamma_b[0:rows, 0:width], op=nl.multiply)
        res = nl.ndarray((rows, width), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=res, data1=y, data2=beta_b[0:rows, 0:width], op=nl.add)
        nisa.dma_copy(dst=out[r0:r1, 0:width], src=res)
    return out


def mlp_gelu_t(x_t, w1, b1, w2, b2):
    """outT = (gelu_tanh(x @ w1 + b1) @ w2 + b2).T from xT [D, T]; w1 [D, I], w2 [I, D]; b1 [I, 1], b2 [D, 1].

    D must be a multiple of 128 (1152 = 9 x 128); I may be ragged (4304 = 33 x 128 + 80).
    """
    width, tokens = x_t.shape
    inter = w1.shape[1]
    pmax = nl.tile_size.pmax
    tmax = nl.tile_size.gemm_moving_fmax
    n_d = width // pmax
    n_i = (inter + pmax - 1) // pmax
    out_t = nl.ndarray((width, tokens), dtype=x_t.dtype, buffer=nl.shared_hbm)
    # Contiguous halves at LNC=2 (365 + 364 of 729 tokens), each streamed 512 at a time.
    my_token_tiles = my_span_tiles(tokens, tmax)
    if not my_token_tiles:
        return out_t

    # Weights and biases stay resident for all of this program's token tiles; the biases in
    # float32, as the per-partition operands of activation and tensor_scalar.
    w1_tiles = load_tiles(w1, width, 0, inter)
    b2_tiles = load_tiles(b2, width, 0, 1, nl.float32)
    w2_tiles = load_tiles(w2, inter, 0, width)
    b1_tiles = load_tiles(b1, inter, 0, 1, nl.float32)

    for t0, t1 in my_token_tiles:
        x_tiles = load_tiles(x_t, width, t0, t1)
        h_tiles = []
        for m in range(n_i):
            i0 = m * pmax
            i1 = min(inter, i0 + pmax)
            acc = nl.ndarray((i1 - i0, t1 - t0), dtype=nl.float32, buffer=nl.psum)
            for k in range(n_d):
                nisa.nc_matmul(dst=acc, stationary=w1_tiles[k][0:pmax, i0:i1], moving=x_tiles[k])
            h = nl.ndarray((i1 - i0, t1 - t0), dtype=x_t.dtype, buffer=nl.sbuf)
            nisa.activation(dst=h, op=nl.gelu_apprx_tanh, data=acc, bias=b1_tiles[m])
            h_tiles.append(h)
        for d in range(n_d):
            acc = nl.ndarray((pmax, t1 - t0), dtype=nl.float32, buffer=nl.psum)
            for m in range(n_i):
                rows = min(inter, m * pmax + pmax) - m * pmax
                nisa.nc_matmul(dst=acc, stationary=w2_tiles[m][0:rows, d * pmax:(d + 1) * pmax],
                               moving=h_tiles[m])
            o = nl.ndarray((pmax, t1 - t0), dtype=x_t.dtype, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=o, data=acc, op0=nl.add, operand0=b2_tiles[d])
            nisa.dma_copy(dst=out_t[d * pmax:(d + 1) * pmax, t0:t1], src=o)
    return out_t


def softmax_rows(scores, scale):
    """softmax(scale * scores) over the last axis; scores [rows, keys] (keys = 729 for SigLIP-384)."""
    n_rows, keys = scores.shape
    pmax = nl.tile_size.pmax
    out = nl.ndarray((n_rows, keys), dtype=scores.dtype, buffer=nl.shared_hbm)
    for r0, r1 in my_tiles(n_rows, pmax):
        rows = r1 - r0
        s = load_tile(scores, r0, r1, 0, keys)
        row_max = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        # The operator table's maximum (nki.api.shared); nl.max is the separate reduction function.
        nisa.tensor_reduce(dst=row_max, op=nl.maximum, data=s, axis=1, keepdims=True)
        shift = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=shift, data=row_max, op0=nl.multiply, operand0=-scale)
        e = nl.ndarray((rows, keys), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=e, op=nl.exp, data=s, bias=shift, scale=scale)
        total = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=total, op=nl.add, data=e, axis=1, keepdims=True)
        inv = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        # VectorE's reciprocal: higher precision than ScalarE's, and below ~64 elements per partition the
        # instruction's start-up dominates, so no slower (nki.api.shared, "NKI Engine Selection").
        nisa.reciprocal(dst=inv, data=total)
        p = nl.ndarray((rows, keys), dtype=scores.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=p, data=e, op0=nl.multiply, operand0=inv)
        nisa.dma_copy(dst=out[r0:r1, 0:keys], src=p)
    return out
