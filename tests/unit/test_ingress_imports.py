"""The ingress replica imports no model code (open_clip, timm, transformers): it decodes, checks and hashes images
and hands texts on untokenized, so the seconds those imports cost belong to the tower replicas alone. torch it
imports for one thing only, the fast path's resize (`fast_jpeg_decode`, the default: models/fast_resize.py, warmed
as the ingress starts); with `fast_jpeg_decode: false` it imports no torch at all.

Run in a fresh interpreter (this process has imported torch long since): the module Serve imports in an
ingress replica, then an ingress with stand-in tower handles (tests/helpers.py) answering an image, a text, a
classify and /readyz through its HTTP app, so the imports a request path makes lazily are counted too. It does
not prove what Serve's own replica machinery imports (that is Ray's, and torch-free as of Ray 2.60)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers import REPO

HEAVY = ("torch", "open_clip", "timm", "transformers")
MODEL_CODE = HEAVY[1:]
# The ingress shares nothing with the tower replicas' code but the plan and the errors both sides know.
REPLICAS = ("siglip_serve.serve.towers.tower_replica", "siglip_serve.serve.towers.image_deployment",
            "siglip_serve.serve.towers.text_deployment")

_INGRESS = """
import base64, json, sys
import numpy as np
from fastapi.testclient import TestClient
import siglip_serve.serve.ingress.ingress_deployment  # what Serve imports in an ingress replica
from siglip_serve.serve.shared import registry
from siglip_serve.serve.ingress.http_app import http_app
from siglip_serve.serve.ingress.endpoints import ROUTES
from tests.helpers import TowerHandle, jpeg_bytes, stand_in_ingress

registry.is_draining = lambda app: False  # no Ray here
image = "data:image/jpeg;base64," + base64.b64encode(jpeg_bytes(np.full((80, 96, 3), 90, np.uint8))).decode()
ingress = stand_in_ingress(TowerHandle(), TowerHandle(), fast_jpeg_decode=%r)
with TestClient(http_app(ingress, ROUTES)) as client:
    answers = [client.post("/v1/embeddings", json={"input": [image, "a cat"]}).status_code,
               client.post("/v1/classify", json={"input": image, "labels": ["cat", "dog"]}).status_code,
               client.get("/readyz").status_code]
print(json.dumps({"answers": answers, "heavy": [name for name in %r if name in sys.modules],
                  "replicas": [name for name in %r if name in sys.modules]}))
"""


def imports_while_serving(fast_jpeg_decode: bool) -> dict[str, list]:
    code = _INGRESS % (fast_jpeg_decode, HEAVY, REPLICAS)
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    seen: dict[str, list] = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["answers"] == [200, 200, 200]
    assert seen["replicas"] == []
    return seen


def test_the_ingress_serves_images_and_texts_without_importing_model_code() -> None:
    seen = imports_while_serving(fast_jpeg_decode=True)
    assert [name for name in seen["heavy"] if name in MODEL_CODE] == []
    assert "torch" in seen["heavy"]  # the fast resize's, and nothing else of the heavy ones


def test_with_the_exact_pixels_the_ingress_imports_no_torch() -> None:
    assert imports_while_serving(fast_jpeg_decode=False)["heavy"] == []
