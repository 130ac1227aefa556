"""The runtime set serves: a virtual environment holding only the distributions of the runtime lock
(requirements/runtime-py3.X.txt, what `pip install siglip-serve` brings, no extras) runs
`siglip-serve run --model tiny-siglip` and answers an image and a text, and the load-test client, the
plots and scikit-image cannot even be imported there. The serving path imports none of them where they
are installed either.

The runtime environment is made of links to this venv's copies of exactly the locked distributions (no
install, no network), so it proves the lock's runtime list is enough to serve and holds none of the
extras; it does not prove that those distributions install from the index (`make serve` does that)."""

from __future__ import annotations

import contextlib
import importlib.metadata as metadata
import re
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path

import httpx
import pytest

from siglip_serve.launcher.preflight import free_port
from tests.bounds import START_S, STOP_S, cluster_start, scaled
from tests.helpers import REPO, embeddings_of, wait_until_ready

pytestmark = pytest.mark.own_cluster

# Off the served path: Locust (and gevent under it), the plots, the old source of the sample photos.
NOT_SERVING = ("locust", "gevent", "matplotlib", "skimage")
LOCK = REPO / "requirements" / f"runtime-py{sys.version_info[0]}.{sys.version_info[1]}.txt"


def locked_names(lock: Path) -> list[str]:
    return re.findall(r"^([A-Za-z0-9_.-]+)==", lock.read_text(), flags=re.MULTILINE)


def runtime_environment(root: Path) -> Path:
    """A venv whose site-packages links each top-level entry of each runtime-locked distribution."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    python = root / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    here = Path(sysconfig.get_path("purelib"))
    for name in locked_names(LOCK):
        dist = metadata.distribution(name)
        tops = {Path(str(f)).parts[0] for f in dist.files or () if not str(f).startswith("..")}
        for top in tops - {"__pycache__"}:
            if not (site / top).exists() and (here / top).exists():
                (site / top).symlink_to(here / top)
    # Our code, editable from the checkout, with both commands (the wheel's own contents:
    # tests/integration/test_wheel.py); nothing it depends on is resolved or installed.
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                    "--no-build-isolation", "--disable-pip-version-check", "-e", str(REPO)], check=True, timeout=300)
    return python


def test_importing_the_serving_path_loads_no_load_test_or_plot_module() -> None:
    code = ("import sys, siglip_serve.__main__, siglip_serve.serve.app, siglip_serve.launcher.cli, "
            "siglip_serve.bulk.cli; print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    loaded = set(out.stdout.split())
    assert "siglip_serve" in loaded and not loaded & set(NOT_SERVING), loaded & set(NOT_SERVING)


def test_the_runtime_lock_alone_serves_tiny_siglip(tmp_path: Path, photo_jpegs: list[bytes]) -> None:
    assert not set(NOT_SERVING) & {n.lower() for n in locked_names(LOCK)}, "an extra is in the runtime lock"
    python = runtime_environment(tmp_path / "runtime")
    for name in NOT_SERVING:
        probe = subprocess.run([str(python), "-c", f"import {name}"], capture_output=True, text=True,
                               timeout=scaled(60))
        assert probe.returncode != 0 and "ModuleNotFoundError" in probe.stderr, (name, probe.stderr[-500:])
    # The commands that need an extra name it instead of failing with a traceback.
    for command, extra in (["loadtest", "loadtest"], ["report", "report"]):
        refused = subprocess.run([str(python), "-m", "siglip_serve", command, "--help"], capture_output=True,
                                 text=True, timeout=scaled(60))
        assert refused.returncode == 2 and f"pip install 'siglip-serve[{extra}]'" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr, refused.stderr
    port = free_port()
    starting = contextlib.ExitStack()
    starting.enter_context(cluster_start("the runtime set's run"))
    proc = subprocess.Popen(
        [str(python), "-m", "siglip_serve", "run", "--model", "tiny-siglip", "--replicas", "1", "--port", str(port),
         "--metrics-port", str(free_port()), "--haproxy-metrics-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url + "/readyz", START_S, proc, lambda: "".join(lines)[-3000:])
        starting.close()
        image = httpx.post(url + "/v1/embeddings/image", content=photo_jpegs[0],
                           headers={"Content-Type": "image/jpeg"}, timeout=scaled(60))
        assert image.status_code == 200, image.text
        assert embeddings_of(image).shape == (1, 64)
        text = httpx.post(url + "/v1/embeddings", json={"input": ["a cat"], "modality": "text"}, timeout=scaled(60))
        assert text.status_code == 200, text.text
        assert [len(item["embedding"]) for item in text.json()["data"]] == [64]
    finally:
        starting.close()
        proc.terminate()
        proc.wait(timeout=STOP_S)
