"""Build devshim's container image without Docker or a registry, from the Dockerfile itself.

    python -m scripts.build_image [--out DIR] [--rebuild]    prints the OCI archive's path

No Docker engine runs on the CI machine and no registry can be reached, yet the real node should
run the image the Dockerfile describes. So this reads the Dockerfile (scripts/dockerfile.py) and
carries out its instructions, stage by stage, on plain folders (root only):

- FROM debian:<suite>-slim: `debootstrap --variant=minbase` of that suite from Debian's mirror
  (how Debian's official images are made), slimmed as theirs are (no docs, manuals, translations)
  and with their apt sources (<suite>, -updates, -security); FROM <stage>: a copy of that stage;
- RUN: `/bin/sh -c` chrooted into the stage, in a private mount namespace holding /dev, /proc
  and the host's resolv.conf (Docker's RUN has them too), with the stage's ENV and WORKDIR;
- COPY: from the build context as .dockerignore filters it, or --from another stage;
- ENV, WORKDIR, LABEL, USER, EXPOSE, ENTRYPOINT, CMD: the image config, as Docker writes it.

The last stage's folder is packed as one uncompressed layer of an OCI layout tar, the form
`ctr images import` takes (shim.compat.realnode.images.write_layout). The archive is kept in
$XDG_CACHE_HOME/devshim/images/, named by a hash of its inputs (this builder, the Dockerfile,
every file of the build context): a second run with nothing changed finds it in a second. What
the mirror and PyPI serve is not hashed: --rebuild picks up their updates. docs/operations.md has
the cost; tests/deploy/test_image.py checks the result against the Dockerfile.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import re
import shutil
import ssl
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

from scripts import dockerfile
from shim.compat.realnode import images

ROOT = dockerfile.ROOT
MIRROR = "http://deb.debian.org/debian"
SECURITY_MIRROR = "http://deb.debian.org/debian-security"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
BUILD_TIMEOUT_S = 1800
# What Debian's -slim images leave out of every package (dpkg path-exclude), copyrights kept.
SLIM_EXCLUDE = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale",
                "usr/share/lintian", "usr/share/groff")  # fmt: skip
SLIM_KEEP = re.compile(r"usr/share/doc/[^/]+/copyright|usr/share/locale/locale\.alias")
# Docker bind-mounts these over the image at run time; the host's copies stay out of it.
HOST_FILES = ("etc/resolv.conf", "etc/hostname")
EMPTIED = ("dev", "proc", "sys", "tmp", "var/lib/apt/lists", "var/cache/apt", "var/cache/debconf")


def log(message: str) -> None:
    print(f"build_image: {message}", file=sys.stderr, flush=True)


def version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"])


def image_name() -> str:
    """What the chart's `image: devshim:<version>` means to containerd (docker.io/library/...)."""
    return f"docker.io/library/devshim:{version()}"


def cache_dir() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "devshim" / "images"


def inputs_key(root: Path = ROOT) -> str:
    """A hash of everything the build reads from this machine: the builder, the Dockerfile, the
    build context's paths and contents."""
    digest = hashlib.sha256()
    for path in (Path(__file__), Path(dockerfile.__file__), Path(images.__file__), root / "Dockerfile"):
        digest.update(path.read_bytes())
    for rel in dockerfile.context_files(root):
        digest.update(rel.encode() + b"\0" + hashlib.sha256((root / rel).read_bytes()).digest())
    return digest.hexdigest()[:16]


def cached_path(root: Path = ROOT) -> Path:
    return cache_dir() / f"devshim-{version()}-{inputs_key(root)}.tar"


@dataclass
class Config:
    """A stage's image config so far, inherited by stages built FROM it."""

    env: dict[str, str] = field(default_factory=lambda: {"PATH": dockerfile.DEFAULT_PATH})
    workdir: str = "/"
    user: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    ports: list[str] = field(default_factory=list)
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)

    def oci(self) -> dict[str, object]:
        """The OCI image config's "config" object, with Docker's field names."""
        config: dict[str, object] = {"Env": [f"{k}={v}" for k, v in self.env.items()]}
        for key, value in (("Entrypoint", self.entrypoint), ("Cmd", self.cmd), ("Labels", self.labels),
                           ("User", self.user)):  # fmt: skip
            if value:
                config[key] = value
        if self.workdir != "/":
            config["WorkingDir"] = self.workdir
        if self.ports:
            config["ExposedPorts"] = {p if "/" in p else f"{p}/tcp": {} for p in self.ports}
        return config


def suite_of(image: str) -> str:
    """debian:<suite>-slim → <suite>: the only kind of base image built here."""
    found = re.fullmatch(r"debian:([a-z]+)-slim", image)
    if not found:
        raise dockerfile.DockerfileError(f"FROM {image}: only debian:<suite>-slim is built without Docker")
    return found.group(1)


def _run(argv: list[str], env: dict[str, str] | None = None) -> None:
    """Run a build step, its output on stderr (stdout is the archive's path alone)."""
    done = subprocess.run(argv, stdout=sys.stderr, env=env, timeout=BUILD_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise SystemExit(f"build_image: {' '.join(argv[:4])} ... exited {done.returncode}")


def _empty(path: Path) -> None:
    """Remove everything inside `path`, keeping the folder itself."""
    for child in path.iterdir() if path.is_dir() else ():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def bootstrap(suite: str, rootfs: Path) -> None:
    """A debian:<suite>-slim equivalent at `rootfs`: minbase, Debian's apt sources, slimmed."""
    if shutil.which("debootstrap") is None:
        raise SystemExit("build_image: debootstrap is missing (Debian: apt-get install debootstrap)")
    log(f"debootstrap --variant=minbase {suite} (about 30 s, mostly downloads)")
    debootstrap = ["debootstrap", "--variant=minbase", f"--keyring={KEYRING}", suite, str(rootfs), MIRROR]
    done = subprocess.run(debootstrap, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
    if done.returncode != 0:  # its log is long: only a failure's end is shown
        tail = (done.stdout + done.stderr)[-3000:]
        raise SystemExit(f"build_image: debootstrap exited {done.returncode}:\n{tail}")
    (rootfs / "etc/apt/sources.list").unlink(missing_ok=True)
    sources = ((MIRROR, f"{suite} {suite}-updates"), (SECURITY_MIRROR, f"{suite}-security"))
    (rootfs / "etc/apt/sources.list.d/debian.sources").write_text("\n".join(
        f"Types: deb\nURIs: {uri}\nSuites: {suites}\nComponents: main\nSigned-By: {KEYRING}\n"
        for uri, suites in sources
    ))  # fmt: skip
    excludes = "".join(f"path-exclude /{p}/*\n" for p in SLIM_EXCLUDE)
    (rootfs / "etc/dpkg/dpkg.cfg.d/slim").write_text(
        "# No docs, manuals or translations, as Debian's -slim images.\n"
        f"{excludes}path-include /usr/share/doc/*/copyright\npath-include /usr/share/locale/locale.alias\n"
    )
    (rootfs / "etc/apt/apt.conf.d/slim").write_text(  # no package caches left in a layer
        'Dir::Cache::pkgcache "";\nDir::Cache::srcpkgcache "";\nAcquire::Languages "none";\n'
        'DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*"; };\n'
    )
    for folder in SLIM_EXCLUDE:
        for path in sorted((rootfs / folder).rglob("*"), reverse=True):
            rel = path.relative_to(rootfs).as_posix()
            if path.is_dir() and not path.is_symlink():
                if not any(path.iterdir()):
                    path.rmdir()
            elif not SLIM_KEEP.fullmatch(rel):
                path.unlink()
    for rel in HOST_FILES:
        (rootfs / rel).unlink(missing_ok=True)
    for rel in EMPTIED:
        _empty(rootfs / rel)
    # The suite's updates and security fixes too, as Debian's images have them.
    upgrade = Config(env={"PATH": dockerfile.DEFAULT_PATH, "DEBIAN_FRONTEND": "noninteractive"})
    run_step(rootfs, "apt-get update && apt-get -y upgrade && rm -rf /var/lib/apt/lists/*", upgrade)
    (rootfs / "var/log/bootstrap.log").unlink(missing_ok=True)


# The RUN sandbox: a private mount namespace (gone with its last process) holding the host's
# /dev, a fresh /proc, the host's resolv.conf and CA bundle, then the command chrooted at its
# WORKDIR.
_SANDBOX = """
root=$1 dir=$2 command=$3 ca=$4
mount --rbind /dev "$root/dev" && mount -t proc proc "$root/proc"
mount --bind /etc/resolv.conf "$root/etc/resolv.conf"
mount --bind "$ca" "$root$BUILD_CA"
exec chroot "$root" /bin/sh -c 'cd "$1" && exec /bin/sh -c "$2"' sh "$dir" "$command"
"""
# pip's index settings pass from this machine to RUN, as `docker build --build-arg` would, and its
# CA bundle (a TLS-inspecting proxy's CA, say) is mounted for the step: neither stays in the image.
PASSED_ENV = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST", "PIP_DEFAULT_TIMEOUT")
BUILD_CA = "/tmp/.build-ca.crt"


def host_ca() -> str:
    """The CA bundle pip uses here: PIP_CERT, else OpenSSL's default."""
    paths = ssl.get_default_verify_paths()
    return os.environ.get("PIP_CERT") or paths.cafile or paths.openssl_cafile


def run_step(rootfs: Path, command: str, config: Config) -> None:
    log(f"RUN {command}")
    placeholders = [p for p in (rootfs / "etc/resolv.conf", rootfs / BUILD_CA.lstrip("/")) if not p.exists()]
    for path in placeholders:
        path.touch()
    try:
        env = {"HOME": "/root", **config.env, "BUILD_CA": BUILD_CA, "PIP_CERT": BUILD_CA}
        env |= {key: os.environ[key] for key in PASSED_ENV if key in os.environ}
        argv = ["unshare", "--mount", "--propagation", "private", "--fork", "--", "/bin/sh", "-euc",
                _SANDBOX, "sandbox", str(rootfs), config.workdir, command, host_ca()]  # fmt: skip
        _run(argv, env={**env, "PATH": f"{env['PATH']}:{dockerfile.DEFAULT_PATH}"})
    finally:
        for path in placeholders:
            path.unlink()


def copy_step(rootfs: Path, args: str, config: Config, stages: dict[str, Path]) -> None:
    words = args.split()
    flags = [w for w in words if w.startswith("--")]
    *sources, dest = [w for w in words if not w.startswith("--")]
    if any(not f.startswith("--from=") for f in flags):
        raise dockerfile.DockerfileError(f"COPY {args}: only --from is implemented")
    target = rootfs / os.path.join(config.workdir, dest).lstrip("/")
    for source in sources:
        if flags:
            origin = stages[flags[0].removeprefix("--from=")] / source.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            _run(["cp", "-a", "--no-target-directory", str(origin), str(target)])
            continue
        prefix = os.path.normpath(source)
        for rel in dockerfile.context_files(ROOT):  # a folder's contents, as Docker copies them
            if prefix == "." or rel == prefix or rel.startswith(prefix + "/"):
                inner = os.path.basename(rel) if rel == prefix else os.path.relpath(rel, prefix)
                (target / inner).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / rel, target / inner)


def build_rootfs(work: Path, text: str) -> tuple[Path, Config]:
    """Every stage of the Dockerfile `text`, in folders under `work`; the last one's folder and config."""
    folders: dict[str, Path] = {}
    configs: dict[str, Config] = {}
    rootfs, config = work, Config()
    for index, stage in enumerate(dockerfile.stages(text)):
        rootfs = work / f"stage-{index}"
        if stage.base in folders:
            log(f"FROM {stage.base} AS {stage.name}: a copy")
            _run(["cp", "-a", str(folders[stage.base]), str(rootfs)])
            config = replace(configs[stage.base], env=dict(configs[stage.base].env),
                             labels=dict(configs[stage.base].labels))  # fmt: skip
        else:
            bootstrap(suite_of(stage.base), rootfs)
            config = Config()
        for keyword, args in stage.steps:
            if keyword == "ENV":
                for key, value in dockerfile.assignments(args).items():
                    config.env[key] = dockerfile.expand(value, config.env)
            elif keyword == "WORKDIR":
                config.workdir = os.path.join(config.workdir, args)
                (rootfs / config.workdir.lstrip("/")).mkdir(parents=True, exist_ok=True)
            elif keyword == "RUN":
                run_step(rootfs, args, config)
            elif keyword == "COPY":
                copy_step(rootfs, args, config, folders)
            elif keyword == "LABEL":
                config.labels.update(dockerfile.assignments(args))
            elif keyword == "USER":
                config.user = args
            elif keyword == "EXPOSE":
                config.ports += args.split()
            elif keyword in ("ENTRYPOINT", "CMD"):
                setattr(config, keyword.lower(), dockerfile.exec_form(args))
        folders[stage.name], configs[stage.name] = rootfs, config
    return rootfs, config


def _owned_by_number(entry: tarfile.TarInfo) -> tarfile.TarInfo:
    entry.uname = entry.gname = ""  # the image's own passwd gives names; the host's must not
    return entry


def write_layer(rootfs: Path, target: Path) -> None:
    """`rootfs` as one layer tar: sorted, owners numeric, hard links kept, sockets left out."""
    with tarfile.open(target, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for folder, dirs, files in os.walk(rootfs):
            dirs.sort()
            for name in [*sorted(files), *dirs]:
                path = Path(folder, name)
                if not path.is_socket():
                    tar.add(path, path.relative_to(rootfs).as_posix(), recursive=False,
                            filter=_owned_by_number)  # fmt: skip


def build(*, rebuild: bool = False) -> Path:
    """The image's OCI archive, built now unless cached (another run building it: waited for)."""
    target = cached_path()
    if target.is_file() and not rebuild:
        return target
    if os.geteuid() != 0:
        raise SystemExit("build_image: debootstrap, chroot and mount need root")
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.is_file() and not rebuild:
            return target
        began = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=".build-", dir=target.parent) as partial:
            work = Path(partial)
            rootfs, config = build_rootfs(work, dockerfile.DOCKERFILE.read_text(encoding="utf-8"))
            log("packing the last stage as an OCI archive")
            write_layer(rootfs, work / "layer.tar")
            images.write_layout(work / "image.tar", image_name(), work / "layer.tar", config.oci())
            for old in target.parent.glob("devshim-*.tar"):  # one image kept: each is ~200 MiB
                old.unlink()
            os.replace(work / "image.tar", target)
        log(f"built {target} in {time.monotonic() - began:.0f} s")
    return target


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.build_image", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="put the archive in this folder (default: the cache's)")
    parser.add_argument("--rebuild", action="store_true", help="build even if the cache holds it")
    args = parser.parse_args()
    path = build(rebuild=args.rebuild)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, args.out / path.name)
        path = args.out / path.name
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
