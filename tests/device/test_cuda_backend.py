"""The cuda backend. Here (no GPU): dtype choice and the construction error. On a GPU the
`cuda`-marked tests check embeddings against the CPU float32 model, with and without CUDA graphs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from siglip_serve.core.errors import BackendUnavailable
from siglip_serve.models.backends.cuda import choose_autocast_dtype
from siglip_serve.models.backends.implementation import check_backend_available, create_encoder
from siglip_serve.models.loading import load_embedder
from siglip_serve.models.settings import ModelSettings


def tiny(**overrides: object) -> ModelSettings:
    return ModelSettings(**{"model": "tiny-siglip", "backend": "cuda", "buckets": (1, 2, 4), **overrides})


def test_autocast_dtype_choice() -> None:
    assert choose_autocast_dtype("bf16", bf16_supported=True) is torch.bfloat16
    assert choose_autocast_dtype("bf16", bf16_supported=False) is torch.float16  # pre-Ampere
    assert choose_autocast_dtype("fp16", bf16_supported=True) is torch.float16
    assert choose_autocast_dtype("fp32", bf16_supported=True) is None
    with pytest.raises(ValueError, match="cuda_dtype"):
        choose_autocast_dtype("int8", bf16_supported=True)


def test_no_gpu_is_a_clear_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(BackendUnavailable) as err:
        create_encoder(tiny())
    message = str(err.value)
    assert "cuda backend needs an NVIDIA GPU" in message and torch.__version__ in message and "\n" not in message
    with pytest.raises(BackendUnavailable, match="cuda backend"):
        check_backend_available(tiny(), None)


def _cpu_reference(images: np.ndarray) -> np.ndarray:
    embedder, _ = load_embedder(tiny(backend="cpu"))
    with torch.inference_mode():
        return embedder(torch.from_numpy(images)).numpy()


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype,bar", [("fp32", 0.9999), ("bf16", 0.999), ("fp16", 0.999)])
def test_gpu_embeddings_match_cpu_fp32(dtype: str, bar: float) -> None:
    images = np.random.default_rng(0).integers(0, 256, (5, 3, 64, 64), dtype=np.uint8)
    encoder = create_encoder(tiny(cuda_dtype=dtype))
    got = encoder.encode(images)
    assert got.dtype == np.float32 and _cosines(got, _cpu_reference(images)).min() >= bar
    assert encoder.describe()["autocast_dtype"] in {"fp32", "bfloat16", "float16"}


@pytest.mark.cuda
def test_cuda_graphs_give_the_same_embeddings() -> None:
    images = np.random.default_rng(1).integers(0, 256, (7, 3, 64, 64), dtype=np.uint8)
    eager = create_encoder(tiny()).encode(images)
    graphed = create_encoder(tiny(cuda_graphs=True))
    assert graphed.describe()["cuda_graphs"] == [1, 2, 4]
    first, second = graphed.encode(images), graphed.encode(images[::-1].copy())
    np.testing.assert_allclose(first, eager, atol=1e-3)
    np.testing.assert_allclose(second, eager[::-1], atol=1e-3)  # replays see new inputs, not stale ones


@pytest.mark.cuda
def test_cuda_graphs_give_the_same_text_embeddings() -> None:
    """The text tower gets the backend's graphs too (one runner for both towers)."""
    from siglip_serve.models.backends.implementation import create_text_encoder

    texts = [f"a photo of a {word}" for word in ("cat", "dog", "car", "tree", "boat", "rocket", "cup")]
    eager = create_text_encoder(tiny(text_buckets=(1, 2, 4))).encode(texts)
    graphed = create_text_encoder(tiny(cuda_graphs=True, text_buckets=(1, 2, 4)))
    assert graphed.describe()["cuda_graphs"] == [1, 2, 4] and graphed.static_shapes
    first, second = graphed.encode(texts), graphed.encode(texts[::-1])
    np.testing.assert_allclose(first, eager, atol=1e-3)
    np.testing.assert_allclose(second, eager[::-1], atol=1e-3)  # replays see new inputs, not stale ones
