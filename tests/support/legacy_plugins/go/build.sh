#!/usr/bin/env bash
# Build the goplug vendor-style device plugin, as a vendor builds one.
#
#   tests/support/legacy_plugins/go/build.sh [OUTPUT]
#
# OUTPUT defaults to tests/support/legacy_plugins/go/build/goplug (git-ignored via build/).
# goplug is a Go module: it imports the upstream API package
# k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1 and google.golang.org/grpc, pinned in
# go.mod/go.sum and fetched through the Go module proxy into Go's module cache (the
# first build downloads about 20 MiB; later ones are offline). It needs only the `go`
# command named in go.mod or newer: nothing from Debian, no protoc.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${1:-$HERE/build/goplug}"
case "$OUT" in /*) ;; *) OUT="$PWD/$OUT" ;; esac

command -v go >/dev/null 2>&1 || {
  echo "build.sh: 'go' not found on PATH: install Go (see README.md, Tests)" >&2
  exit 1
}

mkdir -p "$(dirname "$OUT")"
# GOWORK=off: this module stands alone, as a vendor's does. -mod=readonly: go.sum is the
# pin, and a build never rewrites it. -trimpath -buildvcs=false: no paths or VCS stamps
# of this checkout in the binary.
cd "$HERE"
GOWORK=off CGO_ENABLED=0 GOFLAGS="-mod=readonly" \
  go build -trimpath -buildvcs=false -o "$OUT" .
echo "build.sh: built $OUT"
