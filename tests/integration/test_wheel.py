"""The built wheel is complete: installed into a fresh virtual environment, outside the checkout, it
embeds an image and a text with `tiny-siglip` (config, tokenizer: package data), reads its price table, installs both
commands, and puts everything under `siglip_serve` (no generic top-level `models` or `serve`). What a
dependency installs at the top level (Hugging Face's `kernels`, say) is not ours and not checked. The
fresh environment borrows this one's third-party packages through a path file, so the test needs
no network; it does not prove the wheel's dependency list (CI's `make` install does)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

from tests.helpers import REPO

CHECK = """
import importlib.metadata as metadata, numpy as np
from pathlib import Path
import siglip_serve.models as models, siglip_serve.serve
from siglip_serve.models.backends.implementation import create_encoder, create_text_encoder
from siglip_serve.models.settings import ModelSettings
assert Path(models.__file__).is_relative_to(Path(__import__("sys").prefix)), models.__file__
# What our distribution installed: one top-level package, whatever other distributions put beside it.
ours = {name for name, dists in metadata.packages_distributions().items() if "siglip-serve" in dists}
assert ours == {"siglip_serve"}, ours
# The price table `--instance` reads is package data too (shipped empty: measure/prices.toml says why).
from siglip_serve.measure.prices import TABLE, read_table
assert TABLE.is_relative_to(Path(__import__("sys").prefix)) and read_table() == {}, TABLE
settings = ModelSettings(model="tiny-siglip", torch_threads=1)
image = np.random.default_rng(0).integers(0, 256, (1, 3, 64, 64), dtype=np.uint8)
print(create_encoder(settings).encode(image).shape, create_text_encoder(settings).encode(["a cat"]).shape)
"""


def test_the_wheel_serves_tiny_siglip_from_a_fresh_environment(tmp_path: Path) -> None:
    # From a copy of the sources: a build/ left in the checkout would lend the wheel its stale files.
    source = tmp_path / "src"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".whl", ".gpu", ".pytest_cache", "tests"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(source),
                    "-w", str(tmp_path / "dist")], check=True, timeout=300)
    wheel = next((tmp_path / "dist").glob("siglip_serve-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist()}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"siglip_serve"}, tops
    env_dir = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=120)
    python = env_dir / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # Third-party packages from this environment; its editable finder for our code is not a path,
    # so only the wheel's copy of models/serve/... can be imported there.
    (site / "borrowed.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                    str(wheel)], check=True, timeout=300)
    assert (env_dir / "bin" / "siglip-serve").exists() and (env_dir / "bin" / "siglip-serve-haproxy").exists()
    out = subprocess.run([str(python), "-c", CHECK], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["(1,", "64)", "(1,", "64)"], out.stdout
