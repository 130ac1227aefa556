#!/usr/bin/env bash
# The locks: every distribution `make` installs, transitively, pinned with its hashes, one file per
# Python and extra set (requirements/{runtime,dev}-py3.{11,12}.txt), written by uv's resolver from
# pyproject.toml's ranges and constraints.txt. An existing lock is kept where the ranges still allow it,
# so a run changes only what it must:
#   tools/lock.sh                      # after editing pyproject.toml: add or drop what changed
#   tools/lock.sh --upgrade-package httpx   # one package (and what it needs) to its newest allowed
#   tools/lock.sh --upgrade            # everything to the newest allowed (then run `make test`)
# --latest DIR writes the newest dev set that the ranges and constraints.txt allow into DIR instead,
# ignoring the locks (`make test-latest`, the canary), for this machine's Python.
# The locks are for Linux x86-64 (manylinux_2_28), the CI machines, the device image and deploy/images.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
uv="${UV:-$root/.venv/bin/uv}"
command -v "$uv" >/dev/null || { echo "tools/lock.sh: no uv at $uv (make install puts it in .venv)" >&2; exit 2; }
common=(--generate-hashes --python-platform x86_64-manylinux_2_28 --no-header --annotation-style line --quiet)
out="$root/requirements"
extra=()
latest=""
while (($#)); do
  case "$1" in
    --latest) latest="${2:?--latest needs a folder}"; shift 2 ;;
    --upgrade) extra+=(--upgrade); shift ;;
    --upgrade-package) extra+=(--upgrade-package "${2:?--upgrade-package needs a name}"); shift 2 ;;
    *) echo "usage: $0 [--upgrade | --upgrade-package NAME]... | --latest DIR" >&2; exit 2 ;;
  esac
done
cd "$root"
if [[ -n $latest ]]; then
  mkdir -p "$latest"
  py="$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  "$uv" pip compile pyproject.toml --extra dev -c constraints.txt "${common[@]}" --no-cache --python-version "$py" \
    -o "$latest/dev-py$py.txt"
  exit 0
fi
for py in 3.11 3.12; do
  # runtime first; dev is held to it, so the two never disagree on a shared distribution.
  "$uv" pip compile pyproject.toml -c constraints.txt "${common[@]}" "${extra[@]}" --python-version "$py" \
    -o "$out/runtime-py$py.txt"
  "$uv" pip compile pyproject.toml --extra dev -c constraints.txt -c "$out/runtime-py$py.txt" "${common[@]}" \
    "${extra[@]}" --python-version "$py" -o "$out/dev-py$py.txt"
  "$uv" pip compile "$out/moto-server.in" "${common[@]}" "${extra[@]}" --python-version "$py" \
    -o "$out/moto-server-py$py.txt"
done
echo "tools/lock.sh: $(grep -c '==' "$out/runtime-py3.11.txt") runtime and $(grep -c '==' "$out/dev-py3.11.txt") dev distributions (Python 3.11)"
