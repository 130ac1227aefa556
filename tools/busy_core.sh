#!/usr/bin/env bash
# A slow hour, on demand: runs a command beside one busy core, as a neighbour on a shared machine takes one.
#   tools/busy_core.sh make test                # the suite beside a busy core (docs/dev/test-suite.md)
#   BUSY_CORE_MAX_S=600 tools/busy_core.sh CMD  # the busy loop's own bound (default 7200 s)
# The loop is a plain shell loop at nice 0 (no stress-ng needed), bounded by `timeout`, and ended with the command;
# the command's exit status is this script's. Everything stays on this machine.
set -euo pipefail
[ "$#" -gt 0 ] || { echo "usage: tools/busy_core.sh COMMAND [ARGS...]" >&2; exit 2; }
timeout "${BUSY_CORE_MAX_S:-7200}" sh -c 'while :; do :; done' &
busy=$!
trap 'kill "$busy" 2>/dev/null || true' EXIT
echo "busy core: pid $busy (a shell loop, at most ${BUSY_CORE_MAX_S:-7200} s)" >&2
status=0
"$@" || status=$?
exit "$status"
