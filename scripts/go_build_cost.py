"""Measure what building upstream Kubernetes code as a Go module dependency costs here.

    python -m scripts.go_build_cost [--release v1.37.2] [--work DIR] [--keep]

In a scratch module outside the repo (written by scripts/k8s_gomod.py, with empty GOCACHE and
GOMODCACHE of its own, so nothing on the machine makes it warm) it times, in order:

1. `go mod tidy` for a program importing k8s.io/kubernetes/pkg/kubelet/cm/devicemanager
   (the download), then `go build` of it: cold;
2. the same build again: warm (what a second CI run on the same machine pays);
3. `go build k8s.io/kubernetes/cmd/kube-apiserver` in the same module and caches, so on top
   of what the device manager already compiled (the harness modules share one cache per
   release: docs/architecture.md);
4. the same kube-apiserver build in a second module with empty caches of its own: cold.

For each step it prints the wall time, the peak resident memory of the whole process tree
(sampled every 0.2 s: `go build` runs compilers in parallel, so the largest single process
would understate it) and the size of both caches after it. docs/toolchains.md keeps the
figures.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from scripts.k8s_gomod import render, upstream_gomod

DEVICEMANAGER_MAIN = """package main

import (
\t"fmt"

\t"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
)

// Refers to the manager's constructor so the linker keeps the package and all it imports.
func main() { fmt.Printf("%T\\n", devicemanager.NewManagerImpl) }
"""


def _tree_rss_kib(root: int) -> int:
    """The summed VmRSS of `root` and every process descended from it."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", encoding="utf-8") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        pid = int(entry)
        children.setdefault(int(fields["PPid"]), []).append(pid)
        rss[pid] = int(fields.get("VmRSS", "0 kB").split()[0])
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total


def _du_mib(path: Path) -> float:
    done = subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True, check=False)
    return int(done.stdout.split()[0]) / 1024 if done.returncode == 0 and done.stdout else 0.0


def measure(step: str, command: list[str], cwd: Path, env: dict[str, str], caches: dict[str, Path]) -> None:
    started = time.monotonic()
    proc = subprocess.Popen(command, cwd=cwd, env=env)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, _tree_rss_kib(proc.pid))
        time.sleep(0.2)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"go_build_cost: {step}: {' '.join(command)} exited {proc.returncode}")
    sizes = ", ".join(f"{name} {_du_mib(path):.0f} MiB" for name, path in caches.items())
    print(f"| {step} | {wall:.0f} s | {peak / 1024:.0f} MiB | {sizes} |", flush=True)


def _scratch(folder: Path, gomod: str) -> tuple[Path, dict[str, Path], dict[str, str]]:
    """A module folder holding the device-manager program, its empty caches and its environment."""
    module, caches = folder / "judge", {"GOMODCACHE": folder / "gomodcache", "GOCACHE": folder / "gocache"}
    module.mkdir(parents=True)
    (module / "go.mod").write_text(gomod)
    (module / "main.go").write_text(DEVICEMANAGER_MAIN)
    env = {**os.environ, "GOWORK": "off", "GOFLAGS": "-mod=mod -buildvcs=false"}
    env.update({name: str(path) for name, path in caches.items()})
    return module, caches, env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", default="v1.37.2")
    parser.add_argument("--work", type=Path, help="scratch folder (default: a new temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder and caches")
    args = parser.parse_args(argv)
    if shutil.which("go") is None:
        raise SystemExit("go_build_cost: no `go` on PATH")
    work = args.work or Path(tempfile.mkdtemp(prefix="go-build-cost-"))
    gomod = render(args.release, "example.com/judge", upstream_gomod(args.release))
    module, caches, env = _scratch(work / "first", gomod)
    apiserver_module, apiserver_caches, apiserver_env = _scratch(work / "second", gomod)
    apiserver = ["go", "build", "-o", "kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver"]
    go_version = subprocess.run(["go", "version"], capture_output=True, text=True, check=True).stdout.strip()
    print(f"{go_version}, {os.cpu_count()} CPUs, k8s.io/kubernetes {args.release}, in {work}\n")
    print("| step | wall | peak RSS (process tree) | caches after |\n|---|---|---|---|")
    try:
        measure("devicemanager: go mod tidy (download)", ["go", "mod", "tidy"], module, env, caches)
        measure("devicemanager: go build, cold", ["go", "build", "-o", "dm", "."], module, env, caches)
        (module / "dm").unlink()
        measure("devicemanager: go build, warm", ["go", "build", "-o", "dm", "."], module, env, caches)
        measure("kube-apiserver: go build, on the devicemanager's caches", apiserver, module, env, caches)
        measure(
            "kube-apiserver: go build (download included), cold",
            apiserver,
            apiserver_module,
            apiserver_env,
            apiserver_caches,
        )
        sizes = {name: (module / name).stat().st_size / 2**20 for name in ("dm", "kube-apiserver")}
        print("\nbinaries: " + ", ".join(f"{name} {mib:.0f} MiB" for name, mib in sizes.items()))
    finally:
        if not args.keep:
            # The module cache is read-only on disk; make it writable so it can be removed.
            subprocess.run(["chmod", "-R", "u+w", str(work)], check=False)
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
