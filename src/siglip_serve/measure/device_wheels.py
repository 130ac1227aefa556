"""The wheels a device machine lacks, carried over more than one call (tools/device_wheels.sh, device_check.py).

A device call carries at most 64 MiB, the checkout included, and Ray's cp312 wheel alone is past that. So
`pack` (run here) lays the downloaded wheels end to end over carry folders `.whl-1`, `.whl-2`, ... of at
most `limit` bytes each, cutting a wheel that crosses a folder's end into parts named
`NAME.whl.part-I-of-N`; each folder holds a SHA256SUMS of its files (`sha256sum -c` reads it).
`assemble` (run there by the check's install step) checks every folder's sums, joins each wheel's parts,
in order, from whichever folders hold them, and answers the wheel files to install, naming any part or
folder that is missing.

`derive` lists what to download: the closure of this project's dependencies for the device's Python, cut
at every distribution the device image already holds. Standard library only, but for `derive`: on the
device this runs before anything is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import tomllib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

SUMS = "SHA256SUMS"
PART = re.compile(r"^(?P<wheel>.+\.whl)\.part-(?P<index>\d+)-of-(?P<count>\d+)$")
MIB = 2**20
# Each call's carry folder, with the checkout (about 3 MiB) beside it, under the 64 MiB a call takes.
LIMIT_MIB = 58
CHUNK = 4 * MIB
# The served path's distributions not in the device check's way: Locust is the load-test client
# (loadtest/), which measure/ never imports.
NOT_ON_THE_SERVED_PATH = frozenset({"locust"})
# The device image's interpreter (device README, KINDS.md): markers are evaluated for it, not for this one.
DEVICE_ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "implementation_name": "cpython",
              "platform_python_implementation": "CPython", "sys_platform": "linux", "platform_system": "Linux",
              "platform_machine": "x86_64", "os_name": "posix"}


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def pack(wheels: Sequence[Path], into: Path, limit: int = LIMIT_MIB * MIB, prefix: str = ".whl-") -> list[Path]:
    """Lay `wheels` (largest first) end to end over folders `into/{prefix}1`, ...: each under `limit` bytes,
    a wheel that crosses a folder's end cut into parts there. Earlier folders of that prefix are replaced."""
    if limit <= 0:
        raise ValueError("limit must be positive")
    names = [w.name for w in wheels]
    if len(set(names)) != len(names):
        raise ValueError("two wheels of the same file name")
    for old in into.glob(f"{prefix}[0-9]*"):
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    folders: list[Path] = []
    room = 0
    for wheel in sorted(wheels, key=lambda w: (-w.stat().st_size, w.name)):
        size = wheel.stat().st_size
        pieces: list[tuple[Path, int, int]] = []  # (folder, offset, length)
        offset = 0
        while offset < size or not pieces:
            if room == 0:
                folders.append(into / f"{prefix}{len(folders) + 1}")
                folders[-1].mkdir(parents=True)
                room = limit
            length = min(room, size - offset)
            pieces.append((folders[-1], offset, length))
            offset, room = offset + length, room - length
        with open(wheel, "rb") as source:
            for index, (folder, start, length) in enumerate(pieces, 1):
                name = wheel.name if len(pieces) == 1 else f"{wheel.name}.part-{index}-of-{len(pieces)}"
                source.seek(start)
                with open(folder / name, "wb") as sink:
                    left = length
                    while left:
                        block = source.read(min(CHUNK, left))
                        sink.write(block)
                        left -= len(block)
    for folder in folders:
        files = sorted(f for f in folder.iterdir() if f.name != SUMS)
        (folder / SUMS).write_text("".join(f"{sha256(f)}  {f.name}\n" for f in files))
    return folders


def select(wheels: Iterable[Path], listed: Iterable[str]) -> list[Path]:
    """The wheels that `listed` (NAME==VERSION lines, # comments) names, one each: ValueError names a listed
    one with no wheel, so an older download beside them is left out rather than sent as a second version."""
    want: dict[tuple[str, str], str] = {}
    for line in listed:
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            want[(normalize(name), version.strip())] = line
    chosen: dict[tuple[str, str], Path] = {}
    for wheel in wheels:
        fields = wheel.name.split("-")
        key = (distribution(wheel.name), fields[1] if len(fields) > 1 else "")
        if key in want:
            chosen.setdefault(key, wheel)
    missing = [line for key, line in want.items() if key not in chosen]
    if missing:
        raise ValueError(f"no wheel downloaded for {', '.join(missing)}")
    return sorted(chosen.values(), key=lambda w: w.name)


def check_sums(folder: Path) -> None:
    """Every file the folder's SHA256SUMS lists is there with its sum (ValueError naming what is not)."""
    sums = folder / SUMS
    if not sums.exists():
        return  # a folder of whole wheels downloaded by hand: pip's own checks are all there is
    for line in sums.read_text().splitlines():
        digest, _, name = line.partition("  ")
        path = folder / name
        if not path.exists():
            raise ValueError(f"{path} is missing (listed in {sums})")
        if sha256(path) != digest:
            raise ValueError(f"{path} does not match its sum in {sums}: damaged on the way")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503


def distribution(wheel: str) -> str:
    """A wheel file's distribution, normalized (a wheel's name escapes dashes: its first dash ends it)."""
    return normalize(wheel.split("-", 1)[0])


def assemble(folders: Iterable[Path], staging: Path) -> list[Path]:
    """The wheels to install from `folders`: whole ones where they lie, parted ones joined into `staging`.
    ValueError names a missing part (and so the call that did not carry its folder), a damaged file, or
    two versions of one distribution (which would stop the whole install)."""
    whole: list[Path] = []
    parts: dict[str, dict[int, Path]] = {}
    counts: dict[str, int] = {}
    for folder in folders:
        if not folder.is_dir():
            continue
        check_sums(folder)
        for path in sorted(folder.iterdir()):
            if path.name.endswith(".whl"):
                whole.append(path)
            elif match := PART.match(path.name):
                wheel, count = match["wheel"], int(match["count"])
                if counts.setdefault(wheel, count) != count:
                    raise ValueError(f"{wheel}: parts of two different cuts ({count} and {counts[wheel]})")
                parts.setdefault(wheel, {})[int(match["index"])] = path
    joined: list[Path] = []
    for wheel, found in sorted(parts.items()):
        missing = [i for i in range(1, counts[wheel] + 1) if i not in found]
        if missing:
            raise ValueError(f"{wheel}: part(s) {', '.join(map(str, missing))} of {counts[wheel]} missing "
                             f"(found in {', '.join(sorted({str(p.parent) for p in found.values()}))})")
        staging.mkdir(parents=True, exist_ok=True)
        with open(staging / wheel, "wb") as sink:
            for index in range(1, counts[wheel] + 1):
                with open(found[index], "rb") as source:
                    while block := source.read(CHUNK):
                        sink.write(block)
        joined.append(staging / wheel)
    wheels = whole + joined
    seen: dict[str, str] = {}
    for wheel in wheels:
        other = seen.setdefault(distribution(wheel.name), wheel.name)
        if other != wheel.name:
            raise ValueError(f"two wheels of {distribution(wheel.name)}: {other} and {wheel.name}")
    return sorted(wheels, key=lambda w: w.name)


def derive(report: dict[str, object], roots: Iterable[str], provided: Iterable[str]) -> list[str]:
    """NAME==VERSION for each distribution in `roots`' closure that `provided` lacks, from a `pip install
    --dry-run --report` of the roots: a provided distribution's own needs are the image's business."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    installs = report.get("install")
    if not isinstance(installs, list):
        raise ValueError("the report holds no install list")
    found: dict[str, dict[str, Any]] = {canonicalize_name(i["metadata"]["name"]): i["metadata"] for i in installs}
    have: set[str] = {canonicalize_name(p) for p in provided}
    need: dict[str, set[str]] = {}
    todo = [Requirement(r) for r in roots]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in have or name in NOT_ON_THE_SERVED_PATH:
            continue
        extras = need.get(name)
        if extras is not None and set(req.extras) <= extras:
            continue
        extras = need[name] = (extras or set()) | set(req.extras)
        if name not in found:
            raise ValueError(f"{name} is needed but not in the report")
        for line in found[name].get("requires_dist") or []:
            dep = Requirement(line)
            if dep.marker is None or any(dep.marker.evaluate({**DEVICE_ENV, "extra": e}) for e in ["", *extras]):
                todo.append(dep)
    return [f"{name}=={found[name]['version']}" for name in sorted(need)]


def project_dependencies(pyproject: Path) -> list[str]:
    return list(tomllib.loads(pyproject.read_text())["project"]["dependencies"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m siglip_serve.measure.device_wheels", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = parser.add_subparsers(dest="verb", required=True)
    p = verbs.add_parser("pack", help="lay wheels over carry folders INTO/.whl-1, ...")
    p.add_argument("wheels", type=Path, help="folder of downloaded wheels")
    p.add_argument("--into", type=Path, required=True)
    p.add_argument("--limit-mib", type=float, default=LIMIT_MIB)
    p.add_argument("--list", type=Path, help="only the wheels this NAME==VERSION file names, each one required")
    a = verbs.add_parser("assemble", help="check and join carried folders; print the wheels to install")
    a.add_argument("folders", type=Path, nargs="+")
    a.add_argument("--staging", type=Path, required=True)
    d = verbs.add_parser("derive", help="NAME==VERSION lines to download, from a pip --dry-run --report")
    d.add_argument("report", type=Path)
    d.add_argument("--pyproject", type=Path, required=True)
    d.add_argument("--provided", type=Path, required=True, help="the image's distributions, one a line")
    args = parser.parse_args(argv)
    try:
        if args.verb == "pack":
            wheels = sorted(args.wheels.glob("*.whl"))
            if args.list:
                wheels = select(wheels, args.list.read_text().splitlines())
            for folder in pack(wheels, args.into, int(args.limit_mib * MIB)):
                size = sum(f.stat().st_size for f in folder.iterdir())
                print(f"{folder.name}: {size / MIB:.1f} MiB, {sum(1 for _ in folder.iterdir()) - 1} file(s)")
        elif args.verb == "assemble":
            print("\n".join(map(str, assemble(args.folders, args.staging))))
        else:
            provided = [s.strip() for s in args.provided.read_text().splitlines()
                        if s.strip() and not s.startswith("#")]
            print("\n".join(derive(json.loads(args.report.read_text()), project_dependencies(args.pyproject),
                                   provided)))
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
