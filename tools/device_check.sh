#!/usr/bin/env bash
# Every accelerator figure in one bounded run (siglip-serve device-check, src/siglip_serve/measure/device_check.py):
# install (wheels carried in .whl/ and this checkout, offline), pytest -m cuda, the bare encoder, the served
# default and its host ceiling, the served variants (nvJPEG, the best bucket, one ingress replica), the lanes
# beside a backfill, the verdict, served / bare and, given a price, $ per 1M images; summary.json and summary.md
# in --out. docs/dev/accelerator-check.md says what to --skip to rerun one step.
#   tools/device_check.sh --out /tmp/device-check --bundle "$OUT"          # on a GPU machine (docs/dev/benchmark-log.md)
#   tools/device_check.sh --out /tmp/dc --backend cpu --model tiny-siglip  # the CPU rehearsal
# PYTHON picks the interpreter (default python3: on the device machine the one that holds torch). The
# checkout's src/ is on PYTHONPATH so the check itself runs, and records why, before anything installs.
set -u
root="$(cd "$(dirname "$0")/.." && pwd)"
export PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec "${PYTHON:-python3}" -m siglip_serve device-check "$@"
