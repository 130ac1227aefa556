#!/usr/bin/env bash
# The canary (`make test-latest`): what the suite says of the newest versions that pyproject.toml's ranges
# and constraints.txt allow today, before they reach a fresh clone. It resolves them (tools/lock.sh
# --latest), names every distribution whose version differs from the lock, installs them into a scratch
# venv (.venv-latest, hash-checked) and runs the suite there, as `make test` does. Exit status: the suite's.
#   tools/test_latest.sh [PYTEST ARGS...]     # e.g. tools/test_latest.sh tests/unit
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
py="$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
scratch="${LATEST_DIR:-$root/.venv-latest}"
rm -rf "$scratch"
UV="$root/.venv/bin/uv" tools/lock.sh --latest "$scratch/lock"
latest="$scratch/lock/dev-py$py.txt"
echo "== what differs from requirements/dev-py$py.txt (lock -> newest allowed) =="
.venv/bin/python tools/lockdiff.py "requirements/dev-py$py.txt" "$latest"
python3 -m venv "$scratch/venv"
"$scratch/venv/bin/python" -m pip install --quiet --disable-pip-version-check --require-hashes --no-deps -r "$latest"
"$scratch/venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
"$scratch/venv/bin/python" -m pip check --disable-pip-version-check
echo "== the suite on the newest versions =="
exec "$scratch/venv/bin/python" -m pytest -q --durations=15 -n "${TEST_WORKERS:-2}" --dist loadgroup \
  --no-loadscope-reorder "$@"
