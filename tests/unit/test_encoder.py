"""Encoder interface: bucketing, padding, slicing, input checks and the backend registry."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from siglip_serve.models.backends.implementation import create_encoder
from siglip_serve.models.encoder import EncoderInputError
from siglip_serve.models.settings import ModelSettings
from siglip_serve.models.tower import pick_bucket, split_into_buckets


@pytest.mark.parametrize("n, bucket", [(1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (8, 8)])
def test_pick_bucket_is_smallest_that_holds(n: int, bucket: int) -> None:
    assert pick_bucket(n, (1, 2, 4, 8)) == bucket


def test_pick_bucket_refuses_what_no_bucket_holds() -> None:
    with pytest.raises(ValueError):
        pick_bucket(9, (1, 2, 4, 8))
    with pytest.raises(ValueError):
        pick_bucket(0, (1, 2, 4, 8))


@given(n=st.integers(1, 200), buckets=st.lists(st.integers(1, 32), min_size=1, max_size=5, unique=True))
def test_split_covers_every_image_once_with_minimal_padding(n: int, buckets: list[int]) -> None:
    buckets = sorted(buckets)
    chunks = split_into_buckets(n, buckets)
    covered = [i for start, stop, _ in chunks for i in range(start, stop)]
    assert covered == list(range(n))
    for start, stop, bucket in chunks:
        assert bucket in buckets and bucket >= stop - start
        smaller = [b for b in buckets if b < bucket]
        assert all(b < stop - start for b in smaller)


@pytest.fixture(scope="module")
def tiny_encoder():
    return create_encoder(ModelSettings(model="tiny-siglip", buckets=(1, 2, 4), torch_threads=1))


def random_images(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, 3, 64, 64), dtype=np.uint8)


@pytest.fixture(scope="module")
def static_encoder():
    """The same model run as a compiled backend runs it: only its bucket sizes, padded."""
    encoder = create_encoder(ModelSettings(model="tiny-siglip", buckets=(1, 2, 4), torch_threads=1))
    encoder.static_shapes = True
    return encoder


def test_padding_and_slicing_equal_one_by_one(static_encoder) -> None:
    images = random_images(7)
    before = dict(static_encoder.forward_counts)
    batched = static_encoder.encode(images)
    # 7 images over buckets (1, 2, 4): 4 + 3 -> two forward passes of bucket 4.
    assert static_encoder.forward_counts[4] - before[4] == 2
    singles = np.concatenate([static_encoder.encode(images[i: i + 1]) for i in range(7)])
    assert batched.shape == (7, 64) and batched.dtype == np.float32
    np.testing.assert_allclose(batched, singles, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(batched, axis=1), 1.0, atol=1e-5)


def test_padding_does_not_leak_into_results(static_encoder) -> None:
    images = random_images(3, seed=1)
    alone = static_encoder.encode(images)
    # The same 3 images padded with zeros in bucket 4 must give the same rows.
    np.testing.assert_allclose(alone, static_encoder.encode(np.concatenate([images, random_images(1, 2)]))[:3],
                               atol=1e-5)


def test_eager_cpu_runs_real_sizes_not_padded_buckets(tiny_encoder, static_encoder) -> None:
    assert tiny_encoder.static_shapes is False and tiny_encoder.describe()["static_shapes"] is False
    images = random_images(7, seed=3)
    before = dict(tiny_encoder.forward_counts)
    seen: list[tuple[int, int]] = []
    eager = tiny_encoder.encode(images, lambda size, n, seconds: seen.append((size, n)))
    # Split as the buckets say (at most 4 a pass), but the tail of 3 runs as 3, not as 4.
    assert seen == [(4, 4), (3, 3)]
    assert tiny_encoder.forward_counts[3] - before.get(3, 0) == 1
    np.testing.assert_allclose(eager, static_encoder.encode(images), atol=1e-5)


def test_the_forward_hook_sees_bucket_and_real_count(static_encoder) -> None:
    seen: list[tuple[int, int, bool]] = []
    static_encoder.encode(random_images(3), lambda bucket, n, seconds: seen.append((bucket, n, seconds > 0)))
    assert seen == [(4, 3, True)]


@pytest.mark.parametrize(
    "images",
    [
        np.zeros((2, 3, 64, 64), dtype=np.float32),
        np.zeros((2, 3, 32, 32), dtype=np.uint8),
        np.zeros((2, 64, 64, 3), dtype=np.uint8),
    ],
    ids=["float32", "wrong-size", "channels-last"],
)
def test_bad_input_is_refused_before_the_model(tiny_encoder, images: np.ndarray) -> None:
    with pytest.raises(EncoderInputError):
        tiny_encoder.encode(images)


def test_accepts_torch_tensors(tiny_encoder) -> None:
    images = random_images(2)
    np.testing.assert_allclose(tiny_encoder.encode(torch.from_numpy(images)), tiny_encoder.encode(images), atol=1e-6)


def test_torch_threads_are_set_deliberately() -> None:
    encoder = create_encoder(ModelSettings(model="tiny-siglip", buckets=(1,), torch_threads=2))
    assert encoder.describe()["torch_threads"] == 2 and torch.get_num_threads() == 2
    torch.set_num_threads(1)


def test_warmup_runs_every_bucket(tiny_encoder) -> None:
    before = dict(tiny_encoder.forward_counts)
    seconds = tiny_encoder.warmup(iterations=1)
    assert set(seconds) == {1, 2, 4}
    # warmup calls _forward directly: it does not count as served work.
    assert tiny_encoder.forward_counts == before


def test_unknown_backend_is_refused() -> None:
    with pytest.raises(Exception, match="backend"):
        create_encoder(ModelSettings.model_construct(model="tiny-siglip", backend="tpu", buckets=(1,)))


def test_the_no_model_backend_answers_zero_vectors_of_the_models_shape_and_reads_no_weights() -> None:
    settings = ModelSettings(model="ViT-B-16-SigLIP", backend="zeros-no-model")  # pretrained tag, nothing fetched
    assert not settings.needs_weights and settings.weights_source.startswith("none (zeros-no-model")
    encoder = create_encoder(settings)
    out = encoder.encode(np.zeros((3, 3, 224, 224), dtype=np.uint8))
    assert out.shape == (3, 768) and out.dtype == np.float32 and not out.any()
    assert encoder.describe()["backend"] == "zeros-no-model"
    assert ModelSettings().backend == "cpu"  # never the default
