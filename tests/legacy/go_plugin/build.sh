#!/usr/bin/env bash
# Build the goplug vendor-style device plugin, fully offline.
#
#   tests/legacy/go_plugin/build.sh [OUTPUT]
#
# OUTPUT defaults to tests/legacy/go_plugin/build/goplug (git-ignored via build/).
# Needs only Debian packages (see install-deps.sh): Go code is generated from
# api.proto with protoc + protoc-gen-go + protoc-gen-go-grpc into a temporary
# GOPATH and built with GO111MODULE=off against /usr/share/gocode.  Nothing is
# downloaded.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${1:-$HERE/build/goplug}"
case "$OUT" in /*) ;; *) OUT="$PWD/$OUT" ;; esac
GOCODE="${GOCODE:-/usr/share/gocode}"

die() { echo "build.sh: $*" >&2; exit 1; }
need_cmd() { # command, debian package
  command -v "$1" >/dev/null 2>&1 ||
    die "'$1' not found: install Debian package '$2' (or run $HERE/install-deps.sh)"
}
need_src() { # import path, debian package
  [ -d "$GOCODE/src/$1" ] ||
    die "Go package '$1' not found under $GOCODE/src: install Debian package '$2' (or run $HERE/install-deps.sh)"
}

need_cmd go golang-go
need_cmd protoc protobuf-compiler
need_cmd protoc-gen-go protoc-gen-go
need_cmd protoc-gen-go-grpc protoc-gen-go-grpc
need_src google.golang.org/grpc golang-google-grpc-dev
need_src google.golang.org/protobuf golang-google-protobuf-dev
# grpc-go 1.33 imports github.com/golang/protobuf; the 1.5 API shim (built on
# google.golang.org/protobuf) is required -- the 1.3 package panics at run time.
need_src github.com/golang/protobuf/ptypes golang-github-golang-protobuf-1-5-dev
if dpkg-query -W -f='${Status}' golang-github-golang-protobuf-1-5-dev 2>/dev/null | grep -q "install ok installed"; then
  :
elif command -v dpkg-query >/dev/null 2>&1; then
  die "github.com/golang/protobuf is not from golang-github-golang-protobuf-1-5-dev (1-3 panics at run time): install golang-github-golang-protobuf-1-5-dev"
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/goplug-build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# Temporary GOPATH layout; api.proto's go_package is goplug/deviceplugin/v1beta1.
PKG="$WORK/gopath/src/goplug"
mkdir -p "$PKG/deviceplugin/v1beta1"
cp "$HERE/main.go" "$PKG/main.go"
cp "$HERE/api.proto" "$WORK/api.proto"

protoc -I "$WORK" \
  --go_out="$PKG/deviceplugin/v1beta1" --go_opt=paths=source_relative \
  --go-grpc_out="$PKG/deviceplugin/v1beta1" --go-grpc_opt=paths=source_relative \
  "$WORK/api.proto"

mkdir -p "$(dirname "$OUT")"
export GO111MODULE=off GOFLAGS= GOPROXY=off GOPATH="$WORK/gopath:$GOCODE" CGO_ENABLED=0
# Keep Go's default build cache (fast rebuilds) unless there is no usable HOME.
if [ -z "${GOCACHE:-}" ] && [ -z "${XDG_CACHE_HOME:-}" ] && [ -z "${HOME:-}" ]; then
  export GOCACHE="$WORK/gocache"
fi
(cd "$PKG" && go build -o "$OUT" .)
echo "build.sh: built $OUT"
