"""The host path's options on the real application: more than one ingress replica, and JPEG decode moved
to the encoder replica (`device_jpeg_decode`: nvJPEG on cuda, here torchvision on the cpu device)."""

from __future__ import annotations

import httpx
import pytest

from tests.helpers import ServeCluster, TinyReference, assert_error, cosine, deploy, embeddings_of

TIMEOUT = 60.0
ROUTE = "/host-path"


@pytest.fixture(scope="module")
def url(serve_cluster: ServeCluster) -> str:
    """One application with both options (each deploy costs CI seconds): two ingress replicas, device decode."""
    deploy("host_path", ROUTE, ingress_replicas=2, device_jpeg_decode=True)
    return f"{serve_cluster.base_url}{ROUTE}"


def test_two_ingress_replicas_both_answer_and_embed_correctly(url: str, photo_jpegs: list[bytes],
                                                              tiny_reference: TinyReference) -> None:
    seen: set[str] = set()
    for attempt in range(40):
        # A new connection each time: the front end balances connections over the ingress replicas.
        with httpx.Client(base_url=url, timeout=TIMEOUT) as client:
            assert client.get("/readyz").status_code == 200
            model = client.get("/v1/models").json()["data"][0]
            assert model["ingress_replicas"] == 2
            seen.add(model["ingress_replica"])
            data = photo_jpegs[attempt % len(photo_jpegs)]
            got = embeddings_of(client.post("/v1/embeddings/image", content=data,
                                            headers={"Content-Type": "image/jpeg"}))
            assert got.shape == (1, 64) and cosine(got[0], tiny_reference.embed(data)) >= 0.999
        if len(seen) == 2 and attempt >= 3:
            break
    assert len(seen) == 2, seen


def test_device_jpeg_decode_serves_jpegs_undecoded_and_other_images_as_before(
        url: str, photo_jpegs: list[bytes], tiny_reference: TinyReference) -> None:
    import base64
    import io

    from PIL import Image

    with httpx.Client(base_url=url, timeout=TIMEOUT) as client:
        items = [base64.b64encode(data).decode() for data in photo_jpegs[:3]]
        got = embeddings_of(client.post("/v1/embeddings", json={"input": items}))
        for row, data in zip(got, photo_jpegs[:3], strict=True):
            assert cosine(row, tiny_reference.embed(data)) >= 0.999
        buffer = io.BytesIO()
        Image.open(io.BytesIO(photo_jpegs[0])).save(buffer, "PNG")
        png = buffer.getvalue()  # not a JPEG: decoded on the host, exactly as before
        got = embeddings_of(client.post("/v1/embeddings/image", content=png, headers={"Content-Type": "image/png"}))
        assert cosine(got[0], tiny_reference.embed(png)) >= 0.9999
        # A JPEG whose header is sound and whose data is not: its own 400, found in the replica.
        broken = photo_jpegs[0][:600] + bytes(len(photo_jpegs[0]) - 600)
        assert_error(client.post("/v1/embeddings/image", content=broken, headers={"Content-Type": "image/jpeg"}),
                     400, "invalid_image")
