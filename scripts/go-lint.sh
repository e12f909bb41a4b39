#!/usr/bin/env bash
# gofmt and go vet over every Go module the project owns (each folder with a go.mod,
# docs/architecture.md "Go code"). Each module is checked on its own, with GOWORK=off:
# the modules pin different Kubernetes releases and never share a workspace.
#
#   scripts/go-lint.sh        exits 1 when a file is unformatted or vet finds anything
set -euo pipefail
cd "$(dirname "$0")/.."

command -v go >/dev/null 2>&1 || { echo "go-lint: 'go' not found on PATH" >&2; exit 1; }

mapfile -t modules < <(git ls-files --cached --others --exclude-standard -- '*go.mod' 2>/dev/null | xargs -r -n1 dirname | sort)
if [ "${#modules[@]}" -eq 0 ]; then
    echo "go-lint: no Go modules found (git ls-files '*go.mod')" >&2
    exit 1
fi

status=0
for module in "${modules[@]}"; do
    echo "go-lint: $module"
    unformatted="$(gofmt -l "$module")"
    if [ -n "$unformatted" ]; then
        echo "go-lint: not gofmt-formatted (run gofmt -w):" >&2
        echo "$unformatted" >&2
        status=1
    fi
    (cd "$module" && GOWORK=off GOFLAGS=-mod=readonly go vet ./...) || status=1
done
exit "$status"
