"""`bench --profile` is refused in one line, before anything starts, when it cannot run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from siglip_serve.measure import bench_cli, profile


def test_without_py_spy_the_profile_is_refused_with_the_install_line(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(profile.ProfileRefused, match="pip install py-spy"):
        profile.py_spy()


def test_bench_refuses_a_profile_of_a_skipped_served_part(caplog: pytest.LogCaptureFixture, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(profile, "py_spy", lambda: "py-spy")  # found: the next check is reached
    code = bench_cli.main(["--model", "tiny-siglip", "--skip", "served", "--profile", str(tmp_path / "p"),
                           "--json", str(tmp_path / "b.json")])
    assert code != 0
    (refusal,) = [record.getMessage() for record in caplog.records if record.levelname == "ERROR"]
    assert "--skip served" in refusal and "\n" not in refusal
    assert not (tmp_path / "b.json").exists()
