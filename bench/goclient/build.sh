#!/usr/bin/env bash
# Build goclient, the Go Allocate timer of `python -m bench --rows goclient` (bench/goview.py
# builds it on first use, into bench/goclient/build/, git-ignored).
#
#   bench/goclient/build.sh [OUTPUT]
#
# Its dependencies are pinned as goplug's are (tests/support/legacy_plugins/go: the same grpc
# and k8s.io/kubelet, the same go.sum), so a machine that built goplug builds this offline.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${1:-$HERE/build/goclient}"
case "$OUT" in /*) ;; *) OUT="$PWD/$OUT" ;; esac

command -v go >/dev/null 2>&1 || {
  echo "build.sh: 'go' not found on PATH: install Go 1.26 or newer" >&2
  exit 1
}

mkdir -p "$(dirname "$OUT")"
# As goplug's build.sh: the module alone (GOWORK=off), go.sum the pin (-mod=readonly), no
# paths or VCS stamps of this checkout in the binary.
cd "$HERE"
GOWORK=off CGO_ENABLED=0 GOFLAGS="-mod=readonly" \
  go build -trimpath -buildvcs=false -o "$OUT" .
echo "build.sh: built $OUT"
