"""NumPy golden references for every kernel in this package.

These are the definitions the NKI kernels are checked against. They are written
for clarity, not speed, and each one is itself checked against an independent
implementation (torch) by ``siglip_serve.kernels.check``.
"""
from __future__ import annotations

import numpy as np


def vector_add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch {a.shape} vs {b.shape}")
    return a + b


def tensor_add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Same maths as vector_add; kept separate because its kernel shards rows over 2 cores."""
    return vector_add(a, b)


def transpose2d(x: np.ndarray) -> np.ndarray:
    if x.ndim != 2:
        raise ValueError(f"expected a 2-D matrix, got shape {x.shape}")
    return np.ascontiguousarray(x.T)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def gated_mlp(x: np.ndarray, w_gate: np.ndarray, w_up: np.ndarray, w_down: np.ndarray) -> np.ndarray:
    """``(silu(x @ w_gate) * (x @ w_up)) @ w_down`` for x [tokens, hidden]."""
    if w_gate.shape != w_up.shape or w_down.shape != w_gate.shape[::-1] or x.shape[-1] != w_gate.shape[0]:
        raise ValueError(
            f"incompatible shapes x{x.shape} gate{w_gate.shape} up{w_up.shape} down{w_down.shape}"
        )
    return (silu(x @ w_gate) * (x @ w_up)) @ w_down


def conv2d_valid(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Stride-1, unpadded cross-correlation (what torch calls conv2d).

    x: [batch, c_in, H, W]; w: [c_out, c_in, fh, fw] -> [batch, c_out, H-fh+1, W-fw+1].
    Accumulates one filter tap at a time, mirroring how the kernel accumulates
    one (fh, fw) matmul per tap into PSUM.
    """
    batch, c_in, height, width = x.shape
    c_out, c_in_w, fh, fw = w.shape
    if c_in != c_in_w:
        raise ValueError(f"input has {c_in} channels, filters expect {c_in_w}")
    out_h, out_w = height - fh + 1, width - fw + 1
    if out_h < 1 or out_w < 1:
        raise ValueError(f"filter {fh}x{fw} larger than image {height}x{width}")
    out = np.zeros((batch, c_out, out_h, out_w), dtype=np.result_type(x, w, np.float32))
    for i in range(fh):
        for j in range(fw):
            patch = x[:, :, i : i + out_h, j : j + out_w]  # [b, ci, oh, ow]
            out += np.einsum("oc,bchw->bohw", w[:, :, i, j], patch)
    return out


def maxpool2d(x: np.ndarray, pool: int) -> np.ndarray:
    """Non-overlapping max pool (kernel = stride = pool), dropping ragged edges like torch."""
    if pool < 1:
        raise ValueError("pool must be >= 1")
    batch, chans, height, width = x.shape
    ph, pw = height // pool, width // pool
    if ph < 1 or pw < 1:
        raise ValueError(f"pool {pool} larger than {height}x{width}")
    trimmed = x[:, :, : ph * pool, : pw * pool]
    return trimmed.reshape(batch, chans, ph, pool, pw, pool).max(axis=(3, 5))


def conv2d_bias_maxpool(x: np.ndarray, w: np.ndarray, bias: np.ndarray, pool: int = 1) -> np.ndarray:
    """maxpool(conv2d(x, w) + bias). Bias is per output channel, so adding it after the pool is
    equivalent (max(v + c) = max(v) + c), which is the order the kernel uses to add it once
    per pooled value instead of once per conv output."""
    if bias.shape != (w.shape[0],):
        raise ValueError(f"bias must have shape ({w.shape[0]},), got {bias.shape}")
    pooled = maxpool2d(conv2d_valid(x, w), pool) if pool > 1 else conv2d_valid(x, w)
    return pooled + bias[None, :, None, None]


# --- SigLIP-SO400M/14-384 blocks (width 1152, MLP 4304, 16 heads, 729 patch tokens) ---------

def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """LayerNorm over the last axis (biased variance, as torch.nn.LayerNorm)."""
    if gamma.shape != (x.shape[-1],) or beta.shape != gamma.shape:
        raise ValueError(f"gamma/beta must have shape ({x.shape[-1]},), got {gamma.shape} / {beta.shape}")
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (SigLIP's activation; torch's approximate='tanh')."""
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def mlp_gelu(x: np.ndarray, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray, b2: np.ndarray) -> np.ndarray:
    """``gelu_tanh(x @ w1 + b1) @ w2 + b2`` for x [tokens, width]; w1 [width, inter]; w2 [inter, width]."""
    if (w1.shape[0] != x.shape[-1] or w2.shape != w1.shape[::-1] or b1.shape != (w1.shape[1],)
            or b2.shape != (w2.shape[1],)):
        raise ValueError(f"incompatible shapes x{x.shape} w1{w1.shape} b1{b1.shape} w2{w2.shape} b2{b2.shape}")
    return gelu_tanh(x @ w1 + b1) @ w2 + b2


def softmax(x: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """softmax(scale * x) over the last axis, max-subtracted."""
    z = scale * x
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)
