"""The wheels carried to a device machine over several calls (measure/device_wheels.py) and the check's install
step over them (measure/device_check.py): fake wheels cut into parts over carry folders, joined byte for byte
there, a missing or damaged part named, the pip command line built from them; the download list derived."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from siglip_serve.measure import device_check
from siglip_serve.measure.device_steps import run_step
from siglip_serve.measure.device_wheels import SUMS, assemble, derive, main, pack, select

BIG = "ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl"


def wheels(folder: Path) -> dict[str, bytes]:
    """Three fake wheels of distinct bytes: one past two folders' limit, two small."""
    folder.mkdir()
    made = {BIG: bytes(range(256)) * 10, "fastapi-0.165.0-py3-none-any.whl": b"f" * 300,
            "open_clip_torch-3.3.0-py3-none-any.whl": b"o" * 200}
    for name, data in made.items():
        (folder / name).write_bytes(data)
    return made


def test_pack_cuts_what_crosses_a_folder_and_assemble_joins_it_byte_for_byte(tmp_path: Path) -> None:
    made = wheels(tmp_path / "dl")
    folders = pack(sorted((tmp_path / "dl").glob("*.whl")), tmp_path / "repo", limit=1000)
    assert [f.name for f in folders] == [".whl-1", ".whl-2", ".whl-3", ".whl-4"]
    for folder in folders:
        assert sum(f.stat().st_size for f in folder.iterdir() if f.name != SUMS) <= 1000
    names = {f.name for folder in folders for f in folder.iterdir()}
    assert {f"{BIG}.part-{i}-of-3" for i in (1, 2, 3)} <= names and BIG not in names
    if shutil.which("sha256sum"):  # the first call's staging check on the device: coreutils alone
        for folder in folders:
            subprocess.run(["sha256sum", "-c", "--quiet", SUMS], cwd=folder, check=True)
    got = assemble(folders, tmp_path / "staging")
    assert {w.name: w.read_bytes() for w in got} == made
    assert (tmp_path / "staging" / BIG) in got  # joined; the whole ones are installed where they lie
    again = pack(sorted((tmp_path / "dl").glob("*.whl")), tmp_path / "repo", limit=5000)
    assert [f.name for f in again] == [".whl-1"] and not (tmp_path / "repo" / ".whl-2").exists()


def test_a_missing_folder_a_damaged_part_or_two_versions_is_named(tmp_path: Path) -> None:
    wheels(tmp_path / "dl")
    folders = pack(sorted((tmp_path / "dl").glob("*.whl")), tmp_path / "repo", limit=1000)
    with pytest.raises(ValueError, match=rf"{BIG}: part\(s\) 2, 3 of 3 missing \(found in .*\.whl-1\)"):
        assemble(folders[:1], tmp_path / "staging")  # the second call did not carry .whl-2 and .whl-3
    part = folders[1] / f"{BIG}.part-2-of-3"
    part.write_bytes(b"x" + part.read_bytes()[1:])
    with pytest.raises(ValueError, match="does not match its sum .* damaged on the way"):
        assemble(folders, tmp_path / "staging")
    loose = tmp_path / "loose"
    loose.mkdir()
    (loose / "fastapi-0.110.0-py3-none-any.whl").write_bytes(b"old")
    (loose / "FastAPI-0.165.0-py3-none-any.whl").write_bytes(b"new")
    with pytest.raises(ValueError, match="two wheels of fastapi"):
        assemble([loose, tmp_path / "absent"], tmp_path / "staging")


def test_select_takes_the_listed_versions_and_names_a_missing_one(tmp_path: Path) -> None:
    made = [tmp_path / n for n in ("fastapi-0.110.0-py3-none-any.whl", "fastapi-0.165.0-py3-none-any.whl",
                                   "open_clip_torch-3.3.0-py3-none-any.whl")]
    assert select(made, ["# a comment", "fastapi==0.165.0", "open-clip-torch==3.3.0"]) == made[1:]
    with pytest.raises(ValueError, match="no wheel downloaded for pydantic==2.14.4"):
        select(made, ["fastapi==0.165.0", "pydantic==2.14.4"])


def test_the_install_step_joins_every_carried_folder_and_installs_offline(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    wheels(tmp_path / "dl")
    folders = pack(sorted((tmp_path / "dl").glob("*.whl")), tmp_path / "repo", limit=1000)
    argv = ["--out", str(tmp_path / "out")]
    for folder in folders:
        argv += ["--wheels", str(folder)]
    install = device_check.plan(device_check.build_parser().parse_args(argv))[0]
    assert install.name == "install" and ".whl-1, .whl-2, .whl-3, .whl-4" in install.title
    command = install.command(tmp_path)
    assert command[:8] == [device_check.sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                           "--no-build-isolation"]
    assert command[-2:] == ["-e", str(device_check.ROOT)]
    joined = tmp_path / "tmp" / "siglip-device-wheels" / BIG
    assert str(joined) in command and joined.read_bytes() == (tmp_path / "dl" / BIG).read_bytes()
    assert str(folders[2] / "fastapi-0.165.0-py3-none-any.whl") in command  # whole: installed where it lies
    # Only the first call's folder there: the step fails naming the missing parts, and pip never starts.
    only_first = device_check.plan(device_check.build_parser().parse_args(
        ["--out", str(tmp_path / "out"), "--wheels", str(folders[0])]))[0]
    result = run_step(only_first, tmp_path / "out", time.monotonic() + 60, frozenset(), {}, echo=lambda line: None)
    assert result.status == "failed" and "part(s) 2, 3 of 3 missing" in (result.error or "")


def test_derive_keeps_the_closure_the_image_lacks(tmp_path: Path) -> None:
    def item(name: str, version: str, *requires: str) -> dict[str, object]:
        return {"metadata": {"name": name, "version": version, "requires_dist": list(requires)}}

    report = {"install": [
        item("ray", "2.60.0", "click>=7", "jsonschema", 'fastapi; extra == "serve"',
             'py-spy>=0.2; python_version < "3.12" and extra == "serve"',
             'py-spy>=0.4; python_version >= "3.12" and extra == "serve"', 'tensorboardX; extra == "tune"'),
        item("click", "8.3.0"), item("jsonschema", "4.26.0", "attrs", "referencing"), item("attrs", "25.1.0"),
        item("referencing", "0.37.0"), item("fastapi", "0.165.0", "starlette>=1", "pydantic"),
        item("starlette", "1.10.0", "anyio"), item("anyio", "4.9.0"), item("pydantic", "2.14.4"),
        item("py-spy", "0.4.3"), item("tensorboardX", "2.6"), item("locust", "2.47.0", "gevent"),
        item("gevent", "25.5.1"), item("torch", "2.14.1", "sympy"), item("sympy", "1.14")]}
    roots = ["ray[serve]==2.60.0", "torch>=2.9", "locust==2.47.0"]
    provided = ["Click", "attrs", "anyio", "torch"]
    assert derive(report, roots, provided) == [
        "fastapi==0.165.0", "jsonschema==4.26.0", "py-spy==0.4.3", "pydantic==2.14.4", "ray==2.60.0",
        "referencing==0.37.0", "starlette==1.10.0"]
    with pytest.raises(ValueError, match="missing-one is needed but not in the report"):
        derive(report, ["missing-one"], [])
    # The CLI the shell script calls, on the same report.
    (tmp_path / "report.json").write_text(json.dumps(report))
    (tmp_path / "pyproject.toml").write_text(f"[project]\ndependencies = {json.dumps(roots)}\n")
    (tmp_path / "image.txt").write_text("# the image\n" + "\n".join(provided) + "\n")
    assert main(["derive", str(tmp_path / "report.json"), "--pyproject", str(tmp_path / "pyproject.toml"),
                 "--provided", str(tmp_path / "image.txt")]) == 0
