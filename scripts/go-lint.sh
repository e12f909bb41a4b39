#!/usr/bin/env bash
# gofmt and go vet over every Go module the project owns (each folder with a go.mod,
# docs/architecture.md "Go code"). Each module is checked on its own, with GOWORK=off:
# the modules pin different Kubernetes releases and never share a workspace.
#
# The upstream judge has a module per Kubernetes release, and vetting one compiles that release
# of k8s.io/kubernetes (minutes with a cold Go cache, docs/toolchains.md): by default only the
# oldest and the newest release are vetted, as by default only they are tested (likewise the etcd
# wrappers); --all vets every one (with the full matrix: tests/README.md). gofmt covers every
# module always.
#
#   scripts/go-lint.sh [--all]   exits 1 when a file is unformatted or vet finds anything
set -euo pipefail
all=0
[ "${1:-}" = "--all" ] && all=1
cd "$(dirname "$0")/.."

command -v go >/dev/null 2>&1 || { echo "go-lint: 'go' not found on PATH" >&2; exit 1; }

mapfile -t modules < <(git ls-files --cached --others --exclude-standard -- '*go.mod' 2>/dev/null | xargs -r -n1 dirname | sort)
if [ "${#modules[@]}" -eq 0 ]; then
    echo "go-lint: no Go modules found (git ls-files '*go.mod')" >&2
    exit 1
fi

# The judge's release modules, and the etcd wrappers of the control plane (docs/real-node.md),
# oldest first by version: all but the first and last of each skip vet.
skip_vet=()
for family in '/judges/k8s-1\.' '/judges/etcd-'; do
    mapfile -t versions < <(printf '%s\n' "${modules[@]}" | grep "$family" | sort -V)
    if [ "$all" -eq 0 ] && [ "${#versions[@]}" -gt 2 ]; then
        skip_vet+=("${versions[@]:1:${#versions[@]}-2}")
    fi
done

# The containerd wrapper holds no code of ours (its go.mod's tool lines and a doc.go): vetting
# it type-checks all of containerd, a minute warm and more cold, for nothing (--all vets it).
if [ "$all" -eq 0 ]; then
    mapfile -t -O "${#skip_vet[@]}" skip_vet < <(printf '%s\n' "${modules[@]}" | grep '/judges/containerd-')
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
    if printf '%s\n' "${skip_vet[@]}" | grep -qxF "$module"; then
        echo "go-lint: $module: vet skipped (a middle release, or no code of ours; --all vets it)"
        continue
    fi
    (cd "$module" && GOWORK=off GOFLAGS=-mod=readonly go vet ./...) || status=1
done
exit "$status"
