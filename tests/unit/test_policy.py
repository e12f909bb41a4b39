"""The grant policy on real paths: every classic escape is refused, naming the field.

Symlink tricks are played in a temp tree (an allowed prefix inside tmp_path, a secret beside it)
and with the real /dev/fd (a symlink into /proc), because the check resolves paths as the
container runtime will.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from shim.configfile import ConfigError
from shim.core.resource import ResourceService
from shim.errors import GrantRefused, grpc_status
from shim.grants import GrantSettings, MountSettings
from shim.model import ContainerAllocateRequest, ContainerGrant, Device, DeviceNode, Mount
from shim.ops import series
from shim.policy import GrantPolicy, GrantPolicySettings
from shim.settings import Settings
from shim.sources import StaticSource

RESOURCE = "example.com/gpu"


def policy(**settings: Any) -> GrantPolicy:
    return GrantPolicy(RESOURCE, GrantPolicySettings(**settings))


def in_tree(**settings: Any) -> GrantPolicy:
    """A policy for the symlink games in ``tree``: its files are no devices and it lies below
    /tmp, so those two rules (tested on their own below) are off here."""
    return policy(device_node_types=None, allow_world_writable_dirs=True, **settings)


def node(host_path: str, container_path: str = "/dev/x", permissions: str = "rw") -> ContainerGrant:
    return ContainerGrant(device_nodes=(DeviceNode(container_path, host_path, permissions),))


def mount(host_path: str, container_path: str = "/opt/x", read_only: bool = True) -> ContainerGrant:
    return ContainerGrant(mounts=(Mount(container_path, host_path, read_only),))


def refusal(check: GrantPolicy, grant: ContainerGrant) -> GrantRefused:
    with pytest.raises(GrantRefused) as info:
        check.check(grant)
    return info.value


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """tmp/allowed (the prefix) with a node, symlinks inside it pointing in and out, and
    tmp/secret beside it."""
    allowed, secret = tmp_path / "allowed", tmp_path / "secret"
    allowed.mkdir()
    (secret / "sub").mkdir(parents=True)
    (secret / "key").write_text("x")
    (allowed / "dev0").touch()
    (allowed / "sub").mkdir()
    (allowed / "inner").symlink_to(allowed / "dev0")
    (allowed / "out").symlink_to(secret / "key")
    (allowed / "relative-out").symlink_to("../secret/key")
    (allowed / "outdir").symlink_to(secret)
    (allowed / "dangling").symlink_to(secret / "not-yet")
    (allowed / "chain").symlink_to(allowed / "inner-to-out")
    (allowed / "inner-to-out").symlink_to(allowed / "out")
    (allowed / "updir").symlink_to(secret / "sub")
    (tmp_path / "via").symlink_to(allowed)
    return tmp_path


# --- device nodes --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "host_path", ["/dev/null", "/dev/zero", "/dev/full", "/dev/urandom", "/dev/stdin/../null"]
)
def test_the_default_policy_allows_character_devices_under_dev(host_path: str) -> None:
    GrantPolicy(RESOURCE).check(node(host_path))


def make_node(path: Path, kind: int, major: int, minor: int) -> Path:
    """A device node (root only: mknod needs CAP_MKNOD); a test that needs one skips without."""
    if os.geteuid() != 0:
        pytest.skip("mknod needs root")
    os.mknod(path, kind | 0o600, os.makedev(major, minor))
    return path


@pytest.fixture
def devices() -> Iterator[Path]:
    """A private /dev: nodes made with mknod, each named by what it is, in /run, which only root
    may write to (a temp dir lies below /tmp, which anyone may)."""
    if os.geteuid() != 0:
        pytest.skip("mknod needs root")
    made = Path(tempfile.mkdtemp(prefix="devshim-test-dev-", dir="/run"))
    made.chmod(0o755)
    for name, kind, major, minor in [
        ("null", stat.S_IFCHR, 1, 3),
        ("disk", stat.S_IFBLK, 7, 0),  # a loop device: what /dev/vda is, a block device
        ("mem", stat.S_IFCHR, 1, 1),
        ("kmsg", stat.S_IFCHR, 1, 11),
        ("tty0", stat.S_IFCHR, 4, 0),
        ("ttyS0", stat.S_IFCHR, 4, 64),
        ("sg0", stat.S_IFCHR, 21, 0),
        ("loop-control", stat.S_IFCHR, 10, 237),
        ("kvm", stat.S_IFCHR, 10, 232),
    ]:
        make_node(made / name, kind, major, minor)
    (made / "file").write_text("not a device")
    (made / "dir").mkdir()
    (made / "to-kmsg").symlink_to(made / "kmsg")
    yield made
    shutil.rmtree(made)


def private(devices: Path, **settings: Any) -> GrantPolicy:
    return policy(device_path_prefixes=[str(devices)], **settings)


@pytest.mark.parametrize(
    ("name", "said"),
    [
        pytest.param("disk", "is a block device 7:0", id="block-device"),
        pytest.param("file", "is a regular file", id="regular-file"),
        pytest.param("dir", "is a directory", id="directory"),
        pytest.param("absent", "does not exist", id="absent"),
    ],
)
def test_what_is_not_a_character_device_is_refused_by_default(devices: Path, name: str, said: str) -> None:
    """A block device is a disk (the host's root among them); a directory, a file or nothing
    at all is no device: each is refused, saying what it is."""
    refused = refusal(private(devices), node(str(devices / name)))
    assert refused.rule == f"{str(devices / name)!r} {said}, and device_node_types allows char devices only"
    assert refused.kind == "device_nodes.host_path"


@pytest.mark.parametrize("host_path", ["/dev", "/dev/nvidia-absent"])
def test_dev_itself_and_absent_nodes_are_refused_by_the_default_policy(host_path: str) -> None:
    assert (
        "device_node_types allows char devices only" in refusal(GrantPolicy(RESOURCE), node(host_path)).rule
    )


def test_block_devices_pass_where_the_policy_allows_them_and_anything_where_it_says_null(
    devices: Path,
) -> None:
    private(devices, device_node_types=["char", "block"]).check(node(str(devices / "disk")))
    anything = private(devices, device_node_types=None)
    for name in ("disk", "file", "dir", "absent"):
        anything.check(node(str(devices / name)))


@pytest.mark.parametrize(
    ("name", "number"),
    [
        pytest.param("mem", "1:1", id="mem"),
        pytest.param("kmsg", "1:11", id="kmsg"),
        pytest.param("to-kmsg", "1:11", id="a-link-to-kmsg"),
        pytest.param("tty0", "4:0", id="host-console"),
        pytest.param("ttyS0", "4:64", id="serial-tty"),
        pytest.param("sg0", "21:0", id="scsi-generic"),
        pytest.param("loop-control", "10:237", id="loop-control"),
    ],
)
def test_dangerous_character_devices_are_refused_by_number(devices: Path, name: str, number: str) -> None:
    """By what the node is, not what it is called: a link to /dev/kmsg is /dev/kmsg."""
    refused = refusal(private(devices), node(str(devices / name)))
    assert f"is a character device {number}, which denied_device_numbers refuses" in refused.rule


def test_the_denied_numbers_are_the_operators_to_change(devices: Path) -> None:
    private(devices).check(node(str(devices / "kvm")))  # KubeVirt hands out /dev/kvm
    assert (
        "denied_device_numbers"
        in refusal(private(devices, denied_device_numbers=["c 10:*"]), node(str(devices / "kvm"))).rule
    )
    private(devices, denied_device_numbers=[]).check(node(str(devices / "kmsg")))
    block = private(devices, device_node_types=["char", "block"], denied_device_numbers=["b *:0"])
    assert (
        "is a block device 7:0, which denied_device_numbers"
        in refusal(block, node(str(devices / "disk"))).rule
    )


@pytest.mark.skipif(not os.path.exists("/dev/kmsg"), reason="no /dev/kmsg on this machine")
def test_the_real_dev_kmsg_is_refused() -> None:
    assert "denied_device_numbers" in refusal(GrantPolicy(RESOURCE), node("/dev/kmsg")).rule


WORLD_WRITABLE = "which anyone may write to (allow_world_writable_dirs)"


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm on this machine")
def test_a_link_in_dev_shm_is_refused_before_anyone_can_repoint_it() -> None:
    """/dev/shm is world-writable: a link there to /dev/null, approved, could be repointed to
    /etc/shadow by anyone before the runtime opens it. Refused at once."""
    link = Path("/dev/shm") / f"devshim-test-{os.getpid()}"
    link.symlink_to("/dev/null")
    try:
        refused = refusal(GrantPolicy(RESOURCE), node(str(link)))
    finally:
        link.unlink()
    assert refused.rule == f"it passes through '/dev/shm', {WORLD_WRITABLE}"


def test_host_paths_under_a_world_writable_directory_are_refused(devices: Path, tmp_path: Path) -> None:
    """Nodes and mounts below a directory anyone may write to, however deep, or reached
    through a link that lies in one, are refused; the same paths pass once it is not."""
    shared = devices / "shared"
    shared.mkdir(mode=0o755)
    make_node(shared / "null", stat.S_IFCHR, 1, 3)
    (shared / "hop").symlink_to(devices / "null")
    (devices / "via-shared").symlink_to(shared / "hop")  # root's link, to a link in shared
    check = private(devices, mount_path_prefixes=[str(devices)])
    for path in ("null", "shared/null", "via-shared"):
        check.check(node(str(devices / path)))
    check.check(mount(str(shared / "hop")))
    shared.chmod(0o1777)  # sticky or not: anyone may add a name, or repoint their own link
    for grant in (node(str(shared / "null")), node(str(devices / "via-shared")), mount(str(shared / "hop"))):
        assert refusal(check, grant).rule == f"it passes through {str(shared)!r}, {WORLD_WRITABLE}"
    private(devices, allow_world_writable_dirs=True).check(node(str(devices / "via-shared")))
    # A temp dir lies below /tmp: refused however deep below.
    make_node(tmp_path / "null", stat.S_IFCHR, 1, 3)
    below_tmp = refusal(policy(device_path_prefixes=[str(tmp_path)]), node(str(tmp_path / "null")))
    assert below_tmp.rule == f"it passes through '/tmp', {WORLD_WRITABLE}"


@pytest.mark.parametrize(
    ("host_path", "rule"),
    [
        pytest.param("/etc/shadow", "not under an allowed prefix (/dev)", id="outside"),
        pytest.param("/dev/../etc/passwd", "normalises to '/etc/passwd'", id="dotdot"),
        pytest.param("/dev//../etc/passwd", "normalises to '/etc/passwd'", id="double-slash-dotdot"),
        pytest.param("/dev/./../etc", "normalises to '/etc'", id="dot-dotdot"),
        pytest.param("//etc/passwd", "normalises to '/etc/passwd'", id="leading-double-slash"),
        pytest.param("/devil", "not under an allowed prefix", id="prefix-is-not-a-component"),
        pytest.param("/dev-evil/x", "not under an allowed prefix", id="prefix-dash"),
        pytest.param("/", "not under an allowed prefix", id="root"),
        pytest.param("dev/null", "not an absolute path", id="relative"),
        pytest.param("./dev/null", "not an absolute path", id="dot-relative"),
        pytest.param("", "not an absolute path", id="empty"),
        pytest.param("/dev/null\x00/etc/shadow", "a NUL byte", id="nul"),
        pytest.param("/dev/fd", "resolves to '/proc/", id="dev-fd-into-proc"),
        pytest.param("/dev/fd/../../etc/passwd", "normalises to '/etc/passwd'", id="dev-fd-dotdot"),
    ],
)
def test_escapes_from_dev_are_refused_naming_the_field_and_the_rule(host_path: str, rule: str) -> None:
    """Each classic escape fails with the field, the offending value and the rule."""
    refused = refusal(GrantPolicy(RESOURCE), node(host_path))
    assert refused.field == "device_nodes[0].host_path"
    assert refused.kind == "device_nodes.host_path"
    assert refused.value == host_path
    assert rule in refused.rule
    assert str(refused).startswith(f"{RESOURCE}: grant policy refuses device_nodes[0].host_path ")


def test_a_dev_fd_link_to_an_open_file_is_refused_where_it_leads(tmp_path: Path) -> None:
    """/dev/fd/N is a symlink into /proc that leads to whatever the process has open."""
    secret = tmp_path / "secret"
    secret.write_text("x")
    fd = os.open(secret, os.O_RDONLY)
    try:
        refused = refusal(GrantPolicy(RESOURCE), node(f"/dev/fd/{fd}"))
    finally:
        os.close(fd)
    assert f"resolves to {str(secret)!r}" in refused.rule


def test_a_dev_fd_link_to_a_pipe_is_refused() -> None:
    """/dev/stdin and friends may lead to a pipe, which is no path at all (pipe:[inode])."""
    read, write = os.pipe()
    try:
        refused = refusal(GrantPolicy(RESOURCE), node(f"/dev/fd/{read}"))
    finally:
        os.close(read)
        os.close(write)
    assert "pipe:[" in refused.rule


def test_a_later_entry_is_checked_and_named_by_its_index() -> None:
    """The first node passes, the second does not: the field names index 1."""
    grant = ContainerGrant(
        device_nodes=(DeviceNode("/dev/a", "/dev/null"), DeviceNode("/dev/b", "/etc/passwd"))
    )
    assert refusal(GrantPolicy(RESOURCE), grant).field == "device_nodes[1].host_path"


@pytest.mark.parametrize("name", ["dev0", "inner", "sub/../dev0"])
def test_paths_under_a_prefix_that_stay_inside_it_are_allowed(tree: Path, name: str) -> None:
    """A plain node, a symlink to a node inside, and a '..' that stays inside all pass."""
    in_tree(device_path_prefixes=[str(tree / "allowed")]).check(node(f"{tree}/allowed/{name}"))


@pytest.mark.parametrize(
    ("name", "leads_to"),
    [
        pytest.param("out", "secret/key", id="symlink-out"),
        pytest.param("relative-out", "secret/key", id="relative-symlink-out"),
        pytest.param("outdir/key", "secret/key", id="symlinked-directory-out"),
        pytest.param("chain", "secret/key", id="chain-of-symlinks-out"),
        pytest.param("dangling", "secret/not-yet", id="dangling-symlink-out"),
        # Lexically allowed/x, but the kernel follows updir before '..': secret/x.
        pytest.param("updir/../x", "secret/x", id="dotdot-after-a-symlink"),
    ],
)
def test_symlinks_under_an_allowed_prefix_that_lead_outside_are_refused(
    tree: Path, name: str, leads_to: str
) -> None:
    """Whatever the route out of the prefix, the resolved path is what is judged."""
    refused = refusal(in_tree(device_path_prefixes=[str(tree / "allowed")]), node(f"{tree}/allowed/{name}"))
    assert f"resolves to {str(tree / leads_to)!r}" in refused.rule


def test_the_walk_that_notes_each_link_lands_where_realpath_does(tree: Path) -> None:
    """The policy walks links itself, to know the directory of each one it follows."""
    from shim.policy import _follow

    names = ["allowed/dev0", "allowed/inner", "allowed/out", "allowed/relative-out", "allowed/outdir/key"]
    names += [
        "allowed/chain",
        "allowed/dangling",
        "allowed/updir/../x",
        "via/dev0",
        "via/../secret",
        "absent/x",
    ]
    for path in [
        *(f"{tree}/{name}" for name in names),
        "/dev/fd/0",
        "/dev/stdin",
        "/proc/self/root/dev/null",
        "/",
    ]:
        assert _follow(path)[0] == os.path.realpath(path), path
    assert _follow(f"{tree}/allowed/chain")[1] == (str(tree / "allowed"),) * 3


def test_a_symlink_repointed_after_a_check_is_refused_on_the_next_call(tree: Path) -> None:
    """Where a path leads is never cached, not even for the same grant object (a declared
    grant is handed out again as the same object, and what it says is judged once): a link
    that was inside on one Allocate and outside on the next is refused the second time."""
    check = in_tree(device_path_prefixes=[str(tree / "allowed")])
    link = tree / "allowed" / "moving"
    link.symlink_to(tree / "allowed" / "dev0")
    grant = node(str(link))
    check.check(grant)
    link.unlink()
    link.symlink_to(tree / "secret" / "key")
    assert "resolves to" in refusal(check, grant).rule
    link.unlink()
    link.symlink_to(tree / "allowed" / "dev0")
    check.check(grant)


def test_a_refused_grant_object_is_refused_again() -> None:
    check = policy()
    grant = ContainerGrant(envs={"LD_PRELOAD": "/x.so"})
    assert refusal(check, grant).field == "envs['LD_PRELOAD']"
    assert refusal(check, grant).field == "envs['LD_PRELOAD']"


def test_a_prefix_that_is_a_symlink_also_allows_where_it_leads(tree: Path) -> None:
    """An operator's /var/run (a link to /run) allows paths that resolve under /run."""
    in_tree(device_path_prefixes=[str(tree / "via")]).check(node(f"{tree}/via/dev0"))


@pytest.mark.parametrize(
    ("container_path", "rule"),
    [
        pytest.param("dev/x", "not an absolute path", id="relative"),
        pytest.param("/dev/../etc/x", "'..'", id="dotdot"),
        pytest.param("/dev/x\x00", "a NUL byte", id="nul"),
    ],
)
def test_container_paths_must_be_absolute_without_dotdot(container_path: str, rule: str) -> None:
    refused = refusal(GrantPolicy(RESOURCE), node("/dev/null", container_path))
    assert refused.field == "device_nodes[0].container_path"
    assert rule in refused.rule


def test_device_permissions_other_than_rwm_are_refused() -> None:
    """A driver's permissions are held to the rule static settings already enforce."""
    refused = refusal(GrantPolicy(RESOURCE), node("/dev/null", permissions="rwx"))
    assert refused.field == "device_nodes[0].permissions"


# --- mounts ----------------------------------------------------------------------------------


def test_mounts_are_refused_by_default() -> None:
    refused = refusal(GrantPolicy(RESOURCE), mount("/dev/shm"))
    assert refused.field == "mounts[0].host_path"
    assert "mount_path_prefixes is empty" in refused.rule


def test_a_read_only_mount_under_an_allowed_prefix_passes(tree: Path) -> None:
    in_tree(mount_path_prefixes=[str(tree / "allowed")]).check(mount(f"{tree}/allowed/sub"))


def test_a_writable_mount_is_refused_while_read_only_is_required(tree: Path) -> None:
    check = in_tree(mount_path_prefixes=[str(tree / "allowed")])
    refused = refusal(check, mount(f"{tree}/allowed/sub", read_only=False))
    assert (refused.field, refused.kind) == ("mounts[0].read_only", "mounts.read_only")
    in_tree(mount_path_prefixes=[str(tree / "allowed")], read_only_mounts=False).check(
        mount(f"{tree}/allowed/sub", read_only=False)
    )


def test_mount_host_paths_get_the_same_escape_checks(tree: Path) -> None:
    check = in_tree(mount_path_prefixes=[str(tree / "allowed")])
    for host_path in (f"{tree}/allowed/outdir", f"{tree}/allowed/../secret", f"{tree}/allowedx"):
        assert refusal(check, mount(host_path)).field == "mounts[0].host_path", host_path
    assert refusal(check, mount(f"{tree}/allowed/sub", "/opt/../etc")).field == "mounts[0].container_path"


def test_device_prefixes_do_not_allow_mounts_there() -> None:
    """Mounts have prefixes of their own: /dev for nodes does not let a driver mount /dev."""
    assert refusal(policy(mount_path_prefixes=["/opt"]), mount("/dev")).field == "mounts[0].host_path"


# --- envs, annotations, CDI ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "rule"),
    [
        pytest.param("LD_PRELOAD", "denied", id="ld-preload"),
        pytest.param("LD_LIBRARY_PATH", "denied", id="ld-library-path"),
        # The rest of what issue 23's review found: each runs the driver's code in the container.
        pytest.param("GCONV_PATH", "denied", id="gconv-path"),
        pytest.param("BASH_ENV", "denied", id="bash-env"),
        pytest.param("NODE_OPTIONS", "denied", id="node-options"),
        pytest.param("JAVA_TOOL_OPTIONS", "denied", id="java-tool-options"),
        pytest.param("PYTHONPATH", "denied", id="pythonpath"),
        pytest.param("PATH", "denied", id="path"),
        pytest.param("1ST", "env_name_pattern", id="leading-digit"),
        pytest.param("A=B", "env_name_pattern", id="equals"),
        pytest.param("A B", "env_name_pattern", id="space"),
        pytest.param("", "env_name_pattern", id="empty"),
        # The default pattern ends in "$", which re.match would let past a final newline.
        pytest.param("LD_PRELOAD\n", "env_name_pattern", id="trailing-newline"),
    ],
)
def test_env_names_outside_the_policy_are_refused(name: str, rule: str) -> None:
    refused = refusal(GrantPolicy(RESOURCE), ContainerGrant(envs={"OK": "1", name: "x"}))
    assert refused.field == f"envs[{name!r}]"
    assert rule in refused.rule


@pytest.mark.parametrize(
    ("grant", "field", "rule"),
    [
        pytest.param(mount("/opt/x", "/etc/ld.so.preload"), "mounts[0].container_path",
                     "under /etc, a loader or system location", id="mount-ld-so-preload"),
        pytest.param(mount("/opt/x", "/usr/lib/x86_64-linux-gnu"), "mounts[0].container_path",
                     "under /usr", id="mount-usr-lib"),
        pytest.param(mount("/opt/x", "/opt/../bin"), "mounts[0].container_path", "'..'", id="mount-dotdot"),
        pytest.param(mount("/opt/x", "//"), "mounts[0].container_path", "the container's root",
                     id="mount-root"),
        pytest.param(node("/dev/null", "/proc/sysrq-trigger"), "device_nodes[0].container_path",
                     "under /proc", id="node-proc"),
        pytest.param(node("/dev/null", "/etc//passwd"), "device_nodes[0].container_path", "under /etc",
                     id="node-etc-normalised"),
    ],
)  # fmt: skip
def test_container_paths_in_loader_and_system_locations_are_refused(
    grant: ContainerGrant, field: str, rule: str
) -> None:
    """A mount at /etc/ld.so.preload is LD_PRELOAD by another name; /usr, /bin, /lib are the
    container's programs and libraries; /proc and /sys the kernel's."""
    refused = refusal(policy(mount_path_prefixes=["/opt"]), grant)
    assert (refused.field, rule in refused.rule) == (field, True), refused.rule


def test_the_older_shorter_defaults_can_be_restored_for_one_resource() -> None:
    """CHANGELOG.md's migration: a resource whose driver relied on the old defaults names them."""
    old = policy(
        mount_path_prefixes=["/opt"],
        denied_env_names=["LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT"],
        denied_container_path_prefixes=[],
    )
    old.check(ContainerGrant(envs={"PATH": "/opt/x/bin", "PYTHONPATH": "/opt/x"}))
    old.check(mount("/opt/x", "/etc/x"))
    old.check(node("/dev/null", "/dev/x"))
    assert "denied" in refusal(old, ContainerGrant(envs={"LD_PRELOAD": "x"})).rule


def test_the_env_pattern_must_match_the_whole_name() -> None:
    check = policy(env_name_pattern="NVIDIA_[A-Z_]+", denied_env_names=[])
    check.check(ContainerGrant(envs={"NVIDIA_VISIBLE_DEVICES": "0"}))
    assert refusal(check, ContainerGrant(envs={"XNVIDIA_X": "0"})).kind == "envs"
    assert refusal(check, ContainerGrant(envs={"NVIDIA_X1": "0"})).kind == "envs"


def test_annotations_are_refused_by_default_and_allowed_by_key_prefix() -> None:
    grant = ContainerGrant(annotations={"example.com/owner": "devshim"})
    assert refusal(GrantPolicy(RESOURCE), grant).field == "annotations['example.com/owner']"
    check = policy(annotation_key_prefixes=["example.com/"])
    check.check(grant)
    refused = refusal(check, ContainerGrant(annotations={"example.com.evil.io/x": "1"}))
    assert "not under an allowed key prefix (example.com/)" in refused.rule


@pytest.mark.parametrize(
    ("allowed", "name", "ok"),
    [
        pytest.param(["example.com"], "example.com/gpu=0", True, id="vendor"),
        pytest.param(["example.com"], "other.com/gpu=0", False, id="other-vendor"),
        pytest.param(["example.com"], "example.com.evil.io/gpu=0", False, id="vendor-as-string-prefix"),
        pytest.param(["example.com/gpu"], "example.com/gpu=all", True, id="vendor-and-class"),
        pytest.param(["example.com/gpu"], "example.com/gpu2=0", False, id="other-class"),
        pytest.param(["example.com"], "example.com", False, id="not-a-cdi-name"),
        pytest.param(["example.com"], "example.com/gpu=", False, id="no-device"),
        pytest.param([], "example.com/gpu=0", False, id="none-allowed"),
    ],
)
def test_cdi_devices_must_be_of_an_allowed_vendor(allowed: list[str], name: str, ok: bool) -> None:
    check = policy(cdi_vendor_prefixes=allowed)
    grant = ContainerGrant(cdi_devices=(name,))
    if ok:
        check.check(grant)
    else:
        assert refusal(check, grant).field == "cdi_devices[0]"


@pytest.mark.parametrize(
    ("resource", "name", "refused"),
    [
        pytest.param("example.com/gpu", "example.com/gpu=0", None, id="same-domain"),
        pytest.param("example.com/gpu", "example.com/other=all", None, id="same-domain-other-class"),
        pytest.param("gpu.example.com/i915", "example.com/gpu=0", None, id="parent-domain"),
        pytest.param("gpu.example.com/i915", "gpu.example.com/card=1", None, id="the-domain-itself"),
        pytest.param("example.com/gpu", "nvidia.com/gpu=all", "(example.com: the", id="another-vendor"),
        pytest.param("example.com/gpu", "gpu.example.com/x=0", "(example.com: the", id="sub-domain"),
        pytest.param("example.com/gpu", "evilexample.com/gpu=0", "(example.com: the", id="not-on-a-dot"),
        pytest.param("gpu.example.com/i915", "com/x=0", "(gpu.example.com, example.com: the", id="bare-tld"),
        pytest.param("example.com/gpu", "example.com", "not a CDI device name", id="not-a-cdi-name"),
    ],
)
def test_cdi_names_are_held_to_the_resources_own_vendor_domain_by_default(
    resource: str, name: str, refused: str | None
) -> None:
    """A driver for example.com/gpu must not hand out another vendor's CDI devices."""
    check = GrantPolicy(resource)
    grant = ContainerGrant(cdi_devices=(name,))
    if refused is None:
        check.check(grant)
    else:
        assert refused in refusal(check, grant).rule


def test_a_star_allows_any_cdi_vendor() -> None:
    policy(cdi_vendor_prefixes=["*"]).check(ContainerGrant(cdi_devices=("anyone.io/thing=1",)))


def test_annotation_key_prefixes_null_allows_any_key_but_still_checks_cdi_annotations() -> None:
    check = policy(annotation_key_prefixes=None, cdi_vendor_prefixes=["example.com"])
    check.check(ContainerGrant(annotations={"anything/at-all": "1", "cdi.k8s.io/a": "example.com/gpu=0"}))
    assert refusal(check, ContainerGrant(annotations={"cdi.k8s.io/a": "evil.io/x=0"})).kind == "annotations"


def test_cdi_annotations_are_held_to_the_cdi_vendors() -> None:
    """containerd and CRI-O inject the CDI devices a cdi.k8s.io/ annotation names: the same
    vendors as cdi_devices, or the annotation would be a way around that rule."""
    check = policy(annotation_key_prefixes=["cdi.k8s.io/"], cdi_vendor_prefixes=["example.com"])
    check.check(ContainerGrant(annotations={"cdi.k8s.io/p_0": "example.com/gpu=0,example.com/gpu=1"}))
    refused = refusal(check, ContainerGrant(annotations={"cdi.k8s.io/p_0": "example.com/gpu=0,evil.io/x=1"}))
    assert (refused.field, refused.value) == ("annotations['cdi.k8s.io/p_0']", "evil.io/x=1")


# --- errors, settings ----------------------------------------------------------------------------


def test_a_refusal_is_permission_denied_naming_resource_field_value_and_rule() -> None:
    code, message = grpc_status(refusal(GrantPolicy(RESOURCE), node("/etc/shadow")))
    assert code is grpc.StatusCode.PERMISSION_DENIED
    assert message == (
        f"{RESOURCE}: grant policy refuses device_nodes[0].host_path '/etc/shadow': "
        "not under an allowed prefix (/dev)"
    )


def test_a_huge_offending_value_is_cut_short_in_the_message() -> None:
    message = str(refusal(GrantPolicy(RESOURCE), node("/etc/" + "x" * 100_000)))
    assert len(message) < 400 and message.endswith("(/dev)")


def test_a_grant_inside_every_rule_passes(devices: Path) -> None:
    check = policy(
        device_path_prefixes=["/dev", str(devices)],
        mount_path_prefixes=[str(devices)],
        annotation_key_prefixes=["example.com/"],
        cdi_vendor_prefixes=["example.com"],
    )
    check.check(
        ContainerGrant(
            envs={"GPU_IDS": "0,1"},
            mounts=(Mount("/opt/x", str(devices / "dir"), True),),
            device_nodes=(
                DeviceNode("/dev/a", "/dev/null", "r"),
                DeviceNode("/dev/b", str(devices / "null")),
            ),
            annotations={"example.com/a": "b"},
            cdi_devices=("example.com/gpu=0",),
        )
    )


@pytest.mark.parametrize(
    ("policy_settings", "where"),
    [
        pytest.param({"device_path_prefixes": ["dev"]}, "device_path_prefixes[0]", id="relative-prefix"),
        pytest.param({"mount_path_prefixes": ["/opt", "/a/../b"]}, "mount_path_prefixes[1]", id="dotdot"),
        pytest.param({"device_path_prefixes": ["/dev\x00"]}, "device_path_prefixes[0]", id="nul"),
        pytest.param({"env_name_pattern": "(["}, "env_name_pattern", id="bad-regex"),
        pytest.param({"cdi_vendor_prefixes": ["a.com/x=y"]}, "cdi_vendor_prefixes[0]", id="cdi-name"),
        pytest.param({"annotation_key_prefixes": [""]}, "annotation_key_prefixes[0]", id="empty-prefix"),
        pytest.param({"mounts_ok": True}, "mounts_ok", id="unknown-field"),
    ],
)
def test_bad_policy_settings_are_refused_naming_the_yaml_path(
    policy_settings: dict[str, Any], where: str
) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.load(drivers=[{"name": "sim", "command": ["x"], "policy": policy_settings}])
    assert f"drivers[0].policy.{where}: " in str(info.value)


def test_the_defaults_documented_in_docs_configuration_md_are_the_real_ones() -> None:
    """The "Grant policy" section's YAML block is the default policy, field for field."""
    text = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    block = text.split("## Grant policy", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    documented = yaml.safe_load(block)["policy"]
    assert set(documented) == set(GrantPolicySettings.model_fields)
    assert GrantPolicySettings(**documented) == GrantPolicySettings()


def test_prefixes_are_normalised() -> None:
    settings = GrantPolicySettings(device_path_prefixes=["//dev/", "/sys/class/./net/"])
    assert settings.device_path_prefixes == ["/dev", "/sys/class/net"]


def test_a_driver_resource_policy_replaces_the_driver_policy_whole() -> None:
    settings = Settings.load(
        drivers=[
            {
                "name": "sim",
                "command": ["x"],
                "policy": {"annotation_key_prefixes": ["example.com/"]},
                "resource_policies": {"example.com/nic": {"mount_path_prefixes": ["/opt/nic"]}},
            }
        ]
    )
    driver = settings.drivers[0]
    assert driver.policy_for("example.com/gpu").annotation_key_prefixes == ["example.com/"]
    nic = driver.policy_for("example.com/nic")
    assert nic.mount_path_prefixes == ["/opt/nic"] and nic.annotation_key_prefixes == []


def test_a_resource_policy_key_must_be_a_resource_name() -> None:
    with pytest.raises(ConfigError, match=r"drivers\[0\]\.resource_policies"):
        Settings.load(drivers=[{"name": "sim", "command": ["x"], "resource_policies": {"gpu": {}}}])


@pytest.mark.parametrize(
    ("static", "policy_settings", "said"),
    [
        pytest.param(
            {"count": 2, "grant": {"mounts": [{"container_path": "/etc", "host_path": "/etc"}]}},
            {},
            "static.grant for device 'dev0': mounts[0].host_path '/etc' is outside the resource's "
            "policy: no mounts allowed (mount_path_prefixes is empty)",
            id="mount",
        ),
        pytest.param(
            {
                "devices": [{"id": "gpu0"}, {"id": ".."}],
                "grant": {"device_nodes": [{"container_path": "/dev/g", "host_path": "/dev/{id}"}]},
            },
            {},
            "static.grant for device '..': device_nodes[0].host_path '/dev/..' is outside the "
            "resource's policy: it normalises to '/', not under an allowed prefix (/dev)",
            id="an-id-in-a-path",
        ),
        pytest.param(
            {"count": 1, "grant": {"envs": {"LD_PRELOAD": "/x.so"}}},
            {"denied_env_names": ["LD_PRELOAD"]},
            "envs['LD_PRELOAD'] 'LD_PRELOAD' is outside the resource's policy",
            id="env",
        ),
    ],
)
def test_a_static_grant_outside_its_policy_is_a_config_error(
    static: dict[str, Any], policy_settings: dict[str, Any], said: str
) -> None:
    """Caught when the config loads, naming the resource and the device, not at the first Allocate."""
    resource = {"name": RESOURCE, "static": static, "policy": policy_settings}
    with pytest.raises(ConfigError) as info:
        Settings.load(resources=[resource])
    assert "resources[0]" in str(info.value) and said in str(info.value)


def test_a_static_grant_inside_its_policy_loads_and_no_devices_need_no_check() -> None:
    allowed = {
        "count": 1,
        "grant": {"mounts": [{"container_path": "/o", "host_path": "/opt", "read_only": True}]},
    }
    none = {"count": 0, "grant": {"mounts": [{"container_path": "/etc", "host_path": "/etc"}]}}
    settings = Settings.load(
        resources=[
            {"name": RESOURCE, "static": allowed, "policy": {"mount_path_prefixes": ["/opt"]}},
            {"name": "example.com/none", "static": none},
        ]
    )
    assert [r.name for r in settings.resources] == [RESOURCE, "example.com/none"]


# --- in the core: Allocate ---------------------------------------------------------------------


class RecordingSource(StaticSource):
    def __init__(self, devices: Sequence[Device], grant: GrantSettings) -> None:
        super().__init__(devices, grant)
        self.freed: list[tuple[str, ...]] = []

    async def deallocate(self, device_ids: Sequence[str]) -> None:
        self.freed.append(tuple(device_ids))


def refusals(field: str) -> float:
    value = series.REGISTRY.get_sample_value(
        "devshim_policy_refusals_total", {"resource": RESOURCE, "field": field}
    )
    return value or 0.0


async def test_allocate_outside_the_policy_is_refused_counted_logged_and_released(
    warnings: list[str],
) -> None:
    """The core refuses the grant before the kubelet sees it: PERMISSION_DENIED, the metric
    counts the field, the log names the driver, and the source hears the devices are free."""
    grant = GrantSettings(mounts=[MountSettings(container_path="/etc", host_path="/etc")])
    source = RecordingSource([Device("d0"), Device("d1")], grant)
    service = ResourceService(RESOURCE, source, driver="sim")
    await service.start()
    before = refusals("mounts.host_path")
    try:
        with pytest.raises(GrantRefused) as info:
            await service.allocate([ContainerAllocateRequest(("d0", "d1"))])
        for _ in range(100):
            if source.freed:
                break
            await asyncio.sleep(0.01)
    finally:
        await service.stop()
    assert info.value.field == "mounts[0].host_path"
    assert refusals("mounts.host_path") == before + 1
    assert [m for m in warnings if "outside the policy" in m] == [
        f"{RESOURCE}: driver 'sim' granted mounts[0].host_path '/etc' outside the policy "
        "(no mounts allowed (mount_path_prefixes is empty)); Allocate refused"
    ]
    assert source.freed == [("d0", "d1")]


async def test_allocate_inside_the_policy_is_answered() -> None:
    grant = GrantSettings(mounts=[MountSettings(container_path="/opt", host_path="/opt", read_only=True)])
    service = ResourceService(
        RESOURCE,
        StaticSource([Device("d0")], grant),
        policy=policy(mount_path_prefixes=["/opt"]),
    )
    await service.start()
    try:
        [answer] = await service.allocate([ContainerAllocateRequest(("d0",))])
    finally:
        await service.stop()
    assert answer.mounts == (Mount("/opt", "/opt", True),)


def test_compat_relaxes_every_rule_of_the_policy() -> None:
    """compat judges how a driver speaks, not what a node allows (until issue 25 makes it apply
    `run`'s policy by default): a rule added to the policy must be relaxed there too."""
    from shim.compat.driver_world import ALLOW_ANY_GRANT

    assert set(ALLOW_ANY_GRANT) == set(GrantPolicySettings.model_fields)
