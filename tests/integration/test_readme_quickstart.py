"""What the README promises, against the session's tiny-siglip app (its `main` fixture: no service of its own). The
quickstart's requests run as written, with curl: the image one answers the model's embedding of the image sent, the
text one an embedding per text; only the address changes (the session's port) and the API key is added (the `main`
app has one). And /docs, Swagger UI, loads nothing but the service's own URLs through its real front door."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import httpx
import numpy as np

from tests.helpers import API_KEY, REPO, TinyReference, cosine

QUICKSTART = re.compile(r"^## Quickstart\n(.*?)^## ", re.MULTILINE | re.DOTALL)
BASH_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.MULTILINE | re.DOTALL)
README_ADDRESS = "localhost:8000"


def quickstart_requests() -> list[list[str]]:
    """The curl commands of the README's quickstart block, each as its argv."""
    section = QUICKSTART.search((REPO / "README.md").read_text(encoding="utf-8"))
    assert section is not None, "README.md has no '## Quickstart' section"
    block = BASH_BLOCK.search(section[1])
    assert block is not None, "the quickstart has no bash block"
    lines = block[1].replace("\\\n", " ").splitlines()
    assert any(line.startswith("make serve") for line in lines), "the quickstart starts the service"
    return [shlex.split(line, comments=True) for line in lines if line.startswith("curl ")]


def run_curl(argv: list[str], base_url: str, cwd: Path) -> dict:
    urls = [arg for arg in argv if arg.startswith(README_ADDRESS + "/")]
    assert len(urls) == 1, argv
    argv = [base_url + arg.removeprefix(README_ADDRESS) if arg in urls else arg for arg in argv]
    # curl as the README runs it (.ci/run installs curl).
    run = subprocess.run([*argv, "-sS", "--fail-with-body", "-H", f"Authorization: Bearer {API_KEY}"],
                         capture_output=True, text=True, timeout=120, cwd=cwd)
    assert run.returncode == 0, (argv, run.stdout, run.stderr)
    return json.loads(run.stdout)


def test_the_readmes_quickstart_requests_answer_as_it_says(main_app: str, photo_jpegs: list[bytes],
                                                           tiny_reference: TinyReference, tmp_path: Path) -> None:
    image_request, text_request = quickstart_requests()
    cat = photo_jpegs[1]  # the sample photos' chelsea: a cat
    (tmp_path / "cat.jpg").write_bytes(cat)

    image = run_curl(image_request, main_app, tmp_path)
    assert image["object"] == "list" and image["model"] == "tiny-siglip" and len(image["data"]) == 1
    embedding = np.array(image["data"][0]["embedding"], dtype=np.float32)
    assert cosine(embedding, tiny_reference.embed(cat)) >= 0.9999
    assert abs(float(np.linalg.norm(embedding)) - 1.0) < 1e-3  # the README: L2-normalised

    texts = run_curl(text_request, main_app, tmp_path)
    assert texts["usage"]["read_as"] == ["text", "text"]
    rows = np.array([item["embedding"] for item in texts["data"]], dtype=np.float32)
    assert [item["index"] for item in texts["data"]] == [0, 1]
    assert rows.shape == (2, embedding.shape[0])  # the same space as the image's
    assert np.allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-3)
    assert cosine(rows[0], rows[1]) < 0.9999  # two texts, two embeddings


def test_the_docs_page_loads_only_from_the_service_through_its_front_door(main_app: str) -> None:
    """The README's features: Swagger UI at /docs works air-gapped. Through HAProxy and Serve, every URL the page
    loads is the service's own and answers."""
    with httpx.Client(base_url=main_app, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60) as client:
        page = client.get("/docs")
        assert page.status_code == 200
        urls = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']|url:\s*["']([^"']+)["']""", page.text)
        loaded = [a or b for a, b in urls]
        assert {"/docs/swagger-ui-bundle.js", "/docs/swagger-ui.css", "/openapi.json"} <= set(loaded), loaded
        assert all(url.startswith("/") and not url.startswith("//") for url in loaded), loaded
        for url in loaded:
            assert client.get(url).status_code == 200, url
