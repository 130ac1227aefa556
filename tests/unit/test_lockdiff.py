"""tools/lockdiff.py names exactly the distributions whose pins differ, in uv's lock format."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import REPO

sys.path.insert(0, str(REPO / "tools"))
from lockdiff import differences, pins  # a script beside the others in tools/, not a package

LOCK = """numpy==2.4.6 \\
    --hash=sha256:00 \\
    --hash=sha256:11
    # via siglip-serve
Pillow==13.0.0 \\
    --hash=sha256:22
ray[serve]==2.60.0 ; python_version >= '3.11' \\
    --hash=sha256:33
gone==1.0 \\
    --hash=sha256:44
"""
NEWER = LOCK.replace("numpy==2.4.6", "numpy==2.5.0").replace("gone==1.0", "fresh_pkg==0.1")


def test_pins_read_names_canonically_and_versions_exactly() -> None:
    assert pins(LOCK) == {"numpy": "2.4.6", "pillow": "13.0.0", "ray": "2.60.0", "gone": "1.0"}


def test_each_changed_added_and_dropped_distribution_is_named() -> None:
    assert differences(pins(LOCK), pins(NEWER)) == [
        "fresh-pkg: (not in the lock) -> 0.1", "gone: 1.0 -> (no longer needed)", "numpy: 2.4.6 -> 2.5.0"]
    assert differences(pins(LOCK), pins(LOCK)) == []


def test_the_command_compares_two_lock_files(tmp_path) -> None:
    (tmp_path / "a.txt").write_text(LOCK)
    (tmp_path / "b.txt").write_text(NEWER)
    out = subprocess.run([sys.executable, str(REPO / "tools" / "lockdiff.py"), str(tmp_path / "a.txt"),
                          str(tmp_path / "b.txt")], capture_output=True, text=True, check=True).stdout
    assert "numpy: 2.4.6 -> 2.5.0" in out and out.rstrip().endswith("3 of 4 distributions differ")
