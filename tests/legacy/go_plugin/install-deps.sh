#!/usr/bin/env bash
# Install the Debian (bookworm) packages needed to build the goplug test plugin
# fully offline (GO111MODULE=off, GOPATH=/usr/share/gocode).  Idempotent, quiet.
# NB: golang-github-golang-protobuf-1-5-dev is required; the 1-3 variant panics
# at run time against the newer google.golang.org/protobuf.
set -euo pipefail
PKGS=(
  golang-go
  golang-google-grpc-dev
  golang-google-protobuf-dev
  golang-github-golang-protobuf-1-5-dev
  protoc-gen-go
  protoc-gen-go-grpc
  protobuf-compiler
)
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-deps: all packages already installed"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
