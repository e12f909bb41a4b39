"""The real node's pure parts: its images' bytes, containerd's and the kubelet's configuration."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import tomllib
from pathlib import Path

import pytest

from shim.compat.realnode import containerd, images, kubelet


def _fake_static_elf(tmp_path: Path, interpreter: bool) -> Path:
    """A 64-bit ELF header with two program headers, the second PT_INTERP when asked."""
    elf = bytearray(0x40 + 2 * 56)
    elf[:5] = b"\x7fELF\x02"
    elf[0x20:0x28] = (0x40).to_bytes(8, "little")  # e_phoff
    elf[0x36:0x38] = (56).to_bytes(2, "little")  # e_phentsize
    elf[0x38:0x3A] = (2).to_bytes(2, "little")  # e_phnum
    elf[0x40:0x44] = (1).to_bytes(4, "little")  # PT_LOAD
    elf[0x40 + 56 : 0x44 + 56] = (3 if interpreter else 1).to_bytes(4, "little")
    path = tmp_path / ("dynamic" if interpreter else "static")
    path.write_bytes(bytes(elf))
    return path


def test_a_dynamic_busybox_is_told_apart_from_a_static_one(tmp_path: Path) -> None:
    assert images._has_interpreter(_fake_static_elf(tmp_path, True).read_bytes())
    assert not images._has_interpreter(_fake_static_elf(tmp_path, False).read_bytes())
    with pytest.raises(images.ImageError, match="not a 64-bit ELF"):
        images._has_interpreter(b"#!/bin/sh\n")


def test_an_image_archive_is_an_oci_layout_with_the_name_and_entrypoint(tmp_path: Path) -> None:
    busybox = _fake_static_elf(tmp_path, False)
    image = images.Image("devshim.test/x:1", ("/bin/sleep", "infinity"))
    first, second = tmp_path / "a.tar", tmp_path / "b.tar"
    images.write_archive(image, busybox, first)
    images.write_archive(image, busybox, second)
    assert first.read_bytes() == second.read_bytes()  # same busybox, same digests
    with tarfile.open(first) as tar:
        assert json.loads(_member(tar, "oci-layout")) == {"imageLayoutVersion": "1.0.0"}
        (entry,) = json.loads(_member(tar, "index.json"))["manifests"]
        assert entry["annotations"]["io.containerd.image.name"] == "devshim.test/x:1"
        manifest_bytes = _blob(tar, entry["digest"])
        assert f"sha256:{hashlib.sha256(manifest_bytes).hexdigest()}" == entry["digest"]
        manifest = json.loads(manifest_bytes)
        config = json.loads(_blob(tar, manifest["config"]["digest"]))
        assert config["config"]["Entrypoint"] == ["/bin/sleep", "infinity"]
        (layer,) = manifest["layers"]
        assert config["rootfs"]["diff_ids"] == [layer["digest"]]
        with tarfile.open(fileobj=io.BytesIO(_blob(tar, layer["digest"]))) as rootfs:
            assert {"bin/busybox", "bin/sh", "bin/sleep", "tmp"} <= set(rootfs.getnames())
            assert rootfs.getmember("bin/sh").linkname == "busybox"
            assert _member(rootfs, "bin/busybox") == busybox.read_bytes()


def _member(tar: tarfile.TarFile, name: str) -> bytes:
    found = tar.extractfile(name)
    assert found is not None, name
    return found.read()


def _blob(tar: tarfile.TarFile, digest: str) -> bytes:
    return _member(tar, f"blobs/sha256/{digest.removeprefix('sha256:')}")


def test_containerds_configuration_is_toml_on_the_nodes_own_paths(tmp_path: Path) -> None:
    conf = tomllib.loads(containerd.config(tmp_path))
    assert conf["version"] == 2
    assert conf["root"] == str(tmp_path / "root") and conf["state"] == str(tmp_path / "state")
    assert conf["grpc"]["address"] == str(containerd.socket(tmp_path))
    cri = conf["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == images.PAUSE_IMAGE
    assert cri["restrict_oom_score_adj"] is True  # a VM's root may lack CAP_SYS_RESOURCE
    assert cri["cni"]["conf_dir"].startswith(str(tmp_path))
    assert conf["plugins"]["io.containerd.internal.v1.opt"]["path"].startswith(str(tmp_path))


@pytest.mark.parametrize(("minor", "switches"), [(30, False), (31, True), (37, True)])
def test_the_kubelets_configuration_names_only_what_its_release_knows(
    minor: int, switches: bool, tmp_path: Path
) -> None:
    conf = kubelet.config(
        minor, tmp_path, cgroup_root="/n", runtime_socket=tmp_path / "c.sock", port=1, read_only_port=2
    )
    assert ("failCgroupV1" in conf, "featureGates" in conf) == (switches, switches)
    assert conf["cgroupRoot"] == "/n" and conf["staticPodPath"] == str(tmp_path / "manifests")
    assert conf["containerRuntimeEndpoint"] == f"unix://{tmp_path / 'c.sock'}"
    assert conf["enforceNodeAllocatable"] == ["none"] and conf["failSwapOn"] is False
    assert all(str(tmp_path) in arg for arg in kubelet.command(Path("/k"), tmp_path)[1:4])
