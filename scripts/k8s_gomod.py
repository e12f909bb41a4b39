"""Write a go.mod that imports k8s.io/kubernetes at one release as a dependency.

k8s.io/kubernetes is not built to be imported: its go.mod requires every k8s.io staging module
at v0.0.0 and replaces each with a folder of its own tree (./staging/src/k8s.io/...), which a
module outside that tree cannot see. A consumer replaces each of them with the published
module of the same release instead (k8s.io/api v0.37.2 for k8s.io/kubernetes v1.37.2). This
reads the staging list from the release's own go.mod, through the Go module proxy, so the
lines stay true for every release without a hand-kept list.

    python -m scripts.k8s_gomod v1.37.2 --module example.com/judge > go.mod
    GOWORK=off go mod tidy

Used to lay out the per-release judge modules (docs/architecture.md, "Go code") and by
scripts/go_build_cost.py to measure what building upstream code costs.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys

_RELEASE = re.compile(r"v1\.(\d+)\.(\d+)(-[0-9A-Za-z.]+)?")
# One staging replacement inside a replace block: "k8s.io/api => ./staging/src/k8s.io/api".
_STAGING = re.compile(r"^\s*(k8s\.io/[\w.-]+)\s+=>\s+\./staging/src/\1\s*$", re.MULTILINE)
_GO_LINE = re.compile(r"^go (\d+\.\d+(?:\.\d+)?)\s*$", re.MULTILINE)


def upstream_gomod(release: str) -> str:
    """The text of k8s.io/kubernetes@release's go.mod, fetched with the go command."""
    done = subprocess.run(
        ["go", "mod", "download", "-json", f"k8s.io/kubernetes@{release}"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    info = json.loads(done.stdout or "{}")
    if done.returncode != 0 or "GoMod" not in info:
        why = info.get("Error", done.stderr.strip())
        raise SystemExit(f"k8s_gomod: cannot fetch k8s.io/kubernetes@{release}: {why}")
    with open(info["GoMod"], encoding="utf-8") as f:
        return f.read()


def render(release: str, module: str, upstream: str, local: dict[str, str] | None = None) -> str:
    """A go.mod for `module`, requiring k8s.io/kubernetes@release with its staging modules
    replaced by the published ones of the same release, and each `local` module (path: folder)
    required from its folder in this tree."""
    found = _RELEASE.fullmatch(release)
    if found is None:
        raise SystemExit(f"k8s_gomod: {release!r} is not a k8s.io/kubernetes release such as v1.37.2")
    minor, patch, pre = found.groups()
    staging_version = f"v0.{minor}.{patch}{pre or ''}"
    staging = sorted(set(_STAGING.findall(upstream)))
    if not staging:
        raise SystemExit(f"k8s_gomod: k8s.io/kubernetes@{release}'s go.mod replaces no staging modules")
    go_line = _GO_LINE.search(upstream)
    lines = [
        f"module {module}",
        "",
        f"go {go_line.group(1) if go_line else '1.26'}",
        "",
        f"require k8s.io/kubernetes {release}",
        "",
        *(
            line
            for path, folder in sorted((local or {}).items())
            for line in (f"require {path} v0.0.0", "", f"replace {path} => {folder}", "")
        ),
        f"// k8s.io/kubernetes {release} requires its staging modules at v0.0.0;",
        "// these are the published modules of the same release.",
        "replace (",
        *(f"\t{name} => {name} {staging_version}" for name in staging),
        ")",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("release", help="a k8s.io/kubernetes release, such as v1.37.2")
    parser.add_argument("--module", required=True, help="the module path of the go.mod written")
    parser.add_argument(
        "--local",
        action="append",
        default=[],
        metavar="PATH=FOLDER",
        help="also require module PATH from FOLDER (a replace line), such as the judges' harness",
    )
    args = parser.parse_args(argv)
    local = dict(item.split("=", 1) for item in args.local)
    sys.stdout.write(render(args.release, args.module, upstream_gomod(args.release), local))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
