"""Name every distribution whose pinned version differs between two lock files (uv's or pip-compile's
`name==version \\` lines): what `make test-latest` would test that a fresh clone does not install.
Usage: python tools/lockdiff.py LOCK NEWER    (prints one line a difference; exit 0 either way)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from packaging.utils import canonicalize_name

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)", flags=re.MULTILINE)


def pins(text: str) -> dict[str, str]:
    return {canonicalize_name(name): version for name, version in PIN.findall(text)}


def differences(locked: dict[str, str], newer: dict[str, str]) -> list[str]:
    lines = []
    for name in sorted(locked.keys() | newer.keys()):
        old, new = locked.get(name), newer.get(name)
        if old != new:
            lines.append(f"{name}: {old or '(not in the lock)'} -> {new or '(no longer needed)'}")
    return lines


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    locked, newer = (pins(Path(path).read_text()) for path in argv)
    found = differences(locked, newer)
    print("\n".join(found) if found else "nothing: the lock is the newest allowed set")
    print(f"{len(found)} of {len(newer)} distributions differ")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
