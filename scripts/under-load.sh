#!/usr/bin/env bash
# Run a command while other work keeps every core busy: the suite must pass on whatever machine
# CI gets, so its tests wait for conditions, never for times or orderings that load changes.
#
#   scripts/under-load.sh [-n BUSY] COMMAND...     e.g. scripts/under-load.sh python -m pytest
#
# BUSY (default 2) processes spin at the same priority as COMMAND for as long as it runs; the
# command's exit status is the script's.
set -euo pipefail

busy=2
if [ "${1:-}" = "-n" ]; then
    busy="$2"
    shift 2
fi
[ "$#" -gt 0 ] || { echo "usage: $0 [-n BUSY] COMMAND..." >&2; exit 2; }

pids=()
stop() { [ "${#pids[@]}" -eq 0 ] || kill "${pids[@]}" 2>/dev/null || true; }
trap stop EXIT
for _ in $(seq "$busy"); do
    python3 -c 'while True: pass' &
    pids+=("$!")
done
echo "under-load: $busy busy processes beside: $*" >&2
"$@"
