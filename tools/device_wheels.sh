#!/usr/bin/env bash
# The wheels the device machine lacks, for its Python 3.12 on x86-64, fetched HERE (pip reaches PyPI; the
# device reaches nothing) and laid over carry folders .whl-1, .whl-2, ... in this checkout, each under
# --limit-mib (58: with the checkout beside it, under the 64 MiB one device call carries). A wheel that
# crosses a folder's end is cut into parts; tools/device_check.sh's install step joins them there
# (measure/device_wheels.py). docs/dev/accelerator-check.md gives the device calls that carry them.
#   tools/device_wheels.sh                          # download tools/device-wheels.txt, pack, print the sizes
#   tools/device_wheels.sh --derive PYTHON3.12      # first rewrite tools/device-wheels.txt (below)
# --derive resolves pyproject.toml's dependencies with that interpreter's pip (a recent one, which resolves
# from PyPI's metadata files; an old one downloads whole wheels, torch's too), pinned to the runtime lock for
# Python 3.12 (requirements/runtime-py3.12.txt), and keeps the closure minus tools/device-image-packages.txt.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
py="${PYTHON:-$root/.venv/bin/python}"
[[ -x $py ]] || py=python3
cache="${WHEEL_CACHE:-${TMPDIR:-/tmp}/siglip-device-wheels}"
list="$root/tools/device-wheels.txt"
limit_mib=58
export PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}"
# The device README's flags: cp312 wheels for manylinux x86-64 only, one file per name, no dependencies.
device=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
        --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
        --platform manylinux1_x86_64)

while (($#)); do
  case "$1" in
    --derive)
      py312="${2:?--derive needs a Python 3.12 interpreter}"; shift 2
      work="$(mktemp -d)"
      "$py" -c 'import sys, tomllib; print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))' \
        "$root/pyproject.toml" > "$work/requirements.txt"
      # The tested versions: the runtime lock for the device's Python (tools/lock.sh), its pins without hashes.
      grep -oE '^[A-Za-z0-9][A-Za-z0-9._-]*==[^ ;\\]+' "$root/requirements/runtime-py3.12.txt" > "$work/tested.txt"
      "$py312" -m pip install -q --dry-run --ignore-installed --only-binary=:all: --report "$work/report.json" \
        -r "$work/requirements.txt" -c "$work/tested.txt"
      { echo "# What tools/device_wheels.sh downloads for the device machine (written by its --derive): the closure of"
        echo "# pyproject.toml's dependencies for Python 3.12, pinned to the tested venv, minus the distributions the"
        echo "# device image holds (tools/device-image-packages.txt) and minus Locust (the load-test client, off the"
        echo "# served path). One version of each: two would stop the whole install there."
        "$py" -m siglip_serve.measure.device_wheels derive "$work/report.json" --pyproject "$root/pyproject.toml" \
          --provided "$root/tools/device-image-packages.txt"; } > "$list.new"
      mv "$list.new" "$list"; rm -rf "$work"
      echo "wrote $list: $(grep -vc '^#' "$list") distributions" ;;
    --limit-mib) limit_mib="$2"; shift 2 ;;
    *) echo "usage: $0 [--derive PYTHON3.12] [--limit-mib N]" >&2; exit 2 ;;
  esac
done

mkdir -p "$cache"
"$py" -m pip download -q --no-deps "${device[@]}" -d "$cache" -r "$list"
"$py" -m siglip_serve.measure.device_wheels pack "$cache" --list "$list" --into "$root" --limit-mib "$limit_mib"
tree=$(git -C "$root" ls-files -z | (cd "$root" && xargs -0 stat -c %s 2>/dev/null) | awk '{s += $1} END {print s}')
echo "the checkout's tracked files: $((tree / 1048576)) MiB; a call carries at most 64 MiB with them"
