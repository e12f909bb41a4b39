"""The node's container images, built here from one static busybox: no registry is needed.

Each image is an OCI image layout packed as a tar (what `ctr images import` reads): one
uncompressed layer holding /bin/busybox and the applets the tests use as links to it, a config
naming the entrypoint, a manifest, and an index whose annotation names the image. Entries carry
fixed times and owners, so the same busybox gives the same digests on every run. write_layout
packs any one-layer image the same way: scripts/build_image.py's devshim image too.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import struct
import tarfile
from dataclasses import dataclass
from pathlib import Path

# The sandbox ("pause") image holds each pod's namespaces open; the test image runs commands.
PAUSE_IMAGE = "devshim.test/pause:1"
TEST_IMAGE = "devshim.test/busybox:1"
APPLETS = ("sh", "sleep", "cat", "ls", "env", "echo", "test", "stat", "printf", "true", "sort", "grep")
_DIRS = ("bin", "dev", "etc", "proc", "sys", "tmp")
_OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


class ImageError(RuntimeError):
    """No static busybox to build the images from; the message says which was found."""


@dataclass(frozen=True)
class Image:
    name: str
    entrypoint: tuple[str, ...]


IMAGES = (Image(PAUSE_IMAGE, ("/bin/sleep", "infinity")), Image(TEST_IMAGE, ("/bin/sh",)))


def static_busybox() -> Path:
    """A statically linked busybox (Debian's busybox-static); a dynamic one cannot run in an
    image that holds no libc."""
    for candidate in ("/bin/busybox", shutil.which("busybox")):
        if candidate and Path(candidate).is_file():
            path = Path(candidate).resolve()
            if not _has_interpreter(path.read_bytes()):
                return path
            raise ImageError(f"{path} is dynamically linked; install a static one (Debian: busybox-static)")
    raise ImageError("no busybox found; install a static one (Debian: busybox-static)")


def _has_interpreter(elf: bytes) -> bool:
    """Whether an ELF64 little-endian executable names a dynamic loader (a PT_INTERP header)."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2:
        raise ImageError("busybox is not a 64-bit ELF executable")
    (phoff,) = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    pt_interp = 3
    return any(struct.unpack_from("<I", elf, phoff + i * phentsize)[0] == pt_interp for i in range(phnum))


def _layer(busybox: Path) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in _DIRS:
            entry = tarfile.TarInfo(name)
            entry.type, entry.mode = tarfile.DIRTYPE, 0o1777 if name == "tmp" else 0o755
            tar.addfile(entry)
        data = busybox.read_bytes()
        entry = tarfile.TarInfo("bin/busybox")
        entry.size, entry.mode = len(data), 0o755
        tar.addfile(entry, io.BytesIO(data))
        for applet in APPLETS:
            entry = tarfile.TarInfo(f"bin/{applet}")
            entry.type, entry.linkname, entry.mode = tarfile.SYMTYPE, "busybox", 0o777
            tar.addfile(entry)
    return out.getvalue()


def _blob(tar: tarfile.TarFile, data: bytes) -> dict[str, object]:
    digest = hashlib.sha256(data).hexdigest()
    entry = tarfile.TarInfo(f"blobs/sha256/{digest}")
    entry.size, entry.mode = len(data), 0o644
    tar.addfile(entry, io.BytesIO(data))
    return {"digest": f"sha256:{digest}", "size": len(data)}


def _file_blob(tar: tarfile.TarFile, path: Path) -> dict[str, object]:
    """A blob streamed from a file (a layer can be hundreds of MiB)."""
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while chunk := source.read(1 << 20):
            digest.update(chunk)
    entry = tarfile.TarInfo(f"blobs/sha256/{digest.hexdigest()}")
    entry.size, entry.mode = path.stat().st_size, 0o644
    with path.open("rb") as source:
        tar.addfile(entry, source)
    return {"digest": f"sha256:{digest.hexdigest()}", "size": entry.size}


def _json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def write_layout(target: Path, name: str, layer: bytes | Path, config: dict[str, object]) -> None:
    """An OCI layout tar at `target` naming the image `name`: one uncompressed `layer` (a tar, in
    memory or a file), `config` the image config's "config" object (Entrypoint, Env, ...)."""
    with tarfile.open(target, mode="w", format=tarfile.PAX_FORMAT) as tar:
        layer_ref = _blob(tar, layer) if isinstance(layer, bytes) else _file_blob(tar, layer)
        image_config = {
            "architecture": "amd64",
            "os": "linux",
            "config": config,
            "rootfs": {"type": "layers", "diff_ids": [layer_ref["digest"]]},
        }
        config_ref = _blob(tar, _json(image_config))
        manifest = {
            "schemaVersion": 2,
            "mediaType": _OCI_MANIFEST,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config_ref},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **layer_ref}],
        }
        manifest_ref = _blob(tar, _json(manifest))
        index = {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": _OCI_MANIFEST,
                    **manifest_ref,
                    "annotations": {"io.containerd.image.name": name},
                    "platform": {"architecture": "amd64", "os": "linux"},
                }
            ],
        }
        layout = _json({"imageLayoutVersion": "1.0.0"})
        for entry_name, data in (("oci-layout", layout), ("index.json", _json(index))):
            entry = tarfile.TarInfo(entry_name)
            entry.size, entry.mode = len(data), 0o644
            tar.addfile(entry, io.BytesIO(data))


def write_archive(image: Image, busybox: Path, target: Path) -> None:
    """`image` as an OCI layout tar at `target`."""
    config: dict[str, object] = {"Entrypoint": list(image.entrypoint), "Env": ["PATH=/bin"]}
    write_layout(target, image.name, _layer(busybox), config)
