"""Build the pinned helm the chart's tests run (tests/deploy/test_helm.py, docs/helm.md).

    python -m scripts.build_helm     prints the binary's path; builds it first unless cached

helm is not on PyPI, and nothing outside the package registries can be fetched here, so it is
built from source with the machine's Go: `go install helm.sh/helm/v4/cmd/helm@<HELM_VERSION>`,
the module fetched through the Go module proxy, checked against the checksum database, and its
dependencies pinned by helm's own go.mod and go.sum (helm's module has no replace directives,
so `go install module@version` builds it as released). The version is stamped in as helm's
Makefile does, so `helm version` names it.

The binary is kept in $XDG_CACHE_HOME/devshim/tools/helm-<version>/helm (~/.cache without
XDG_CACHE_HOME): a second run finds it and runs no Go at all. Go's own caches (GOMODCACHE,
GOCACHE) hold the sources and compiled packages, so rebuilding a lost binary only links. Measured
on 2 cores (README.md, Tests): cold, with empty Go caches, 3 min 7 s, leaving 545 MiB of module
cache and 1.2 GiB of build cache; warm 0.1 s (no Go); 3 s when only the binary is gone.

DEVSHIM_HELM=/path/to/helm makes the tests use another helm instead; nothing is built then.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HELM_MODULE = "helm.sh/helm/v4"
HELM_VERSION = "v4.3.1"  # the newest helm on the Go module proxy when pinned
OVERRIDE_ENV = "DEVSHIM_HELM"
BUILD_TIMEOUT_S = 1800


def cache_dir() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "devshim" / "tools" / f"helm-{HELM_VERSION}"


def helm_path() -> Path:
    """Where the helm the tests use is: DEVSHIM_HELM, else the pinned build's cache path (which
    may not exist yet)."""
    override = os.environ.get(OVERRIDE_ENV)
    return Path(override) if override else cache_dir() / "helm"


def built() -> bool:
    path = helm_path()
    return path.is_file() and os.access(path, os.X_OK)


def build(*, log: bool = True) -> Path:
    """The pinned helm, built now unless it already is (another run building it: waited for)."""
    target = helm_path()
    if built():
        return target
    if os.environ.get(OVERRIDE_ENV):
        raise SystemExit(f"build_helm: {OVERRIDE_ENV}={target} is not an executable file")
    if shutil.which("go") is None:
        raise SystemExit("build_helm: helm is built with Go (1.26 or newer) and 'go' is not on PATH")
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if built():
            return target
        if log:
            # On stderr: stdout is the path alone, for `$(python -m scripts.build_helm)`.
            print(
                f"build_helm: building helm {HELM_VERSION} with Go (minutes if Go's caches are cold)",
                file=sys.stderr,
            )
        with tempfile.TemporaryDirectory(prefix=".build-", dir=target.parent) as partial:
            ldflags = f"-s -w -X {HELM_MODULE}/internal/version.version={HELM_VERSION}"
            # GOWORK=off, GOFLAGS cleared: `go install module@version` builds that module alone,
            # as released, whatever module or workspace the current directory is in.
            env = {**os.environ, "GOBIN": partial, "GOWORK": "off", "GOFLAGS": "", "CGO_ENABLED": "0"}
            command = ["go", "install", "-trimpath", "-buildvcs=false", "-ldflags", ldflags]
            done = subprocess.run(
                [*command, f"{HELM_MODULE}/cmd/helm@{HELM_VERSION}"],
                env=env, cwd=partial, timeout=BUILD_TIMEOUT_S, check=False,
            )  # fmt: skip
            if done.returncode != 0:
                raise SystemExit(f"build_helm: go install exited {done.returncode}")
            os.replace(Path(partial) / "helm", target)  # atomic: a reader never sees half a binary
    return target


def main() -> int:
    path = build()
    version = subprocess.run(
        [str(path), "version", "--template", "{{.Version}}"], capture_output=True, text=True, check=True
    ).stdout.strip()
    if not os.environ.get(OVERRIDE_ENV) and version != HELM_VERSION:
        raise SystemExit(f"build_helm: {path} says it is {version!r}, not {HELM_VERSION}: remove it")
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
