"""More than one ingress replica (issue 21): both take requests, and readiness and answers stay right."""

from __future__ import annotations

import httpx

from tests.helpers import ServeCluster, TinyReference, cosine, deploy, embeddings_of

TIMEOUT = 60.0


def test_two_ingress_replicas_both_answer_and_embed_correctly(serve_cluster: ServeCluster, photo_jpegs: list[bytes],
                                                              tiny_reference: TinyReference) -> None:
    deploy("two_ingress", "/two-ingress", ingress_replicas=2)
    url = f"{serve_cluster.base_url}/two-ingress"
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
            assert got.shape == (1, 64) and cosine(got[0], tiny_reference.embed(data)) >= 0.9999
        if len(seen) == 2 and attempt >= 3:
            break
    assert len(seen) == 2, seen
