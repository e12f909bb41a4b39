"""The grant policy on real paths: deny by default, every classic escape refused, naming the field.

A grant passes only what its operator declared (``GrantPolicySettings``); each refusal names the
field, the value, and the setting that would allow it. Symlink tricks are played in a temp tree
(an allowed glob inside tmp_path, a secret beside it) and with the real /dev/fd (a symlink into
/proc), because the check resolves paths as the container runtime will. The floor's rules are
tested in test_policy_floor.py, the suggested declaration in test_policy_suggest.py, glob and
allowlist matching against references in test_policy_properties.py.
"""

from __future__ import annotations

import asyncio
import contextlib
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

from shim.compat.driver_world import ALLOW_ANY_GRANT
from shim.configfile import ConfigError
from shim.core.resource import ResourceService
from shim.errors import GrantRefused, grpc_status
from shim.grants import GrantSettings, MountSettings
from shim.model import ContainerAllocateRequest, ContainerGrant, Device, DeviceNode, Mount
from shim.ops import series
from shim.policy import GrantPolicy, GrantPolicySettings
from shim.policy.paths import Looks
from shim.settings import Settings
from shim.sources import StaticSource

RESOURCE = "example.com/gpu"
WHERE = "drivers[sim].policy"  # the setting a refusal names as the one that would allow it
WORLD_WRITABLE = f"which anyone may write to ({WHERE}.allow_world_writable_dirs)"


def policy(**settings: Any) -> GrantPolicy:
    return GrantPolicy(RESOURCE, GrantPolicySettings(**settings), WHERE)


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


def undeclared(setting: str, example: str) -> str:
    return f"not declared: {WHERE}.{setting} would allow it, e.g. [{example}]"


@contextlib.contextmanager
def private_dir() -> Iterator[Path]:
    """A directory in /run, which only root may write to (a temp dir lies below /tmp, which
    anyone may): device nodes made there with mknod pass the world-writable rule."""
    if os.geteuid() != 0:
        pytest.skip("mknod and /run need root")
    made = Path(tempfile.mkdtemp(prefix="devshim-test-dev-", dir="/run"))
    made.chmod(0o755)
    try:
        yield made
    finally:
        shutil.rmtree(made)


def make_node(path: Path, kind: int, major: int, minor: int) -> Path:
    os.mknod(path, kind | 0o600, os.makedev(major, minor))
    return path


@pytest.fixture
def devices() -> Iterator[Path]:
    """A private /dev of nodes made with mknod, each named by what it is."""
    with private_dir() as made:
        make_node(made / "null", stat.S_IFCHR, 1, 3)
        make_node(made / "disk", stat.S_IFBLK, 7, 0)  # a loop device: what /dev/vda is, a block device
        (made / "file").write_text("not a device")
        (made / "dir").mkdir()
        yield made


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """tmp/allowed (the glob's tree) with a node, symlinks inside it pointing in and out, and
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


# --- deny by default -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("grant", "field", "kind", "setting", "example"),
    [
        pytest.param(ContainerGrant(envs={"SIM_DEVICES": "0"}), "envs['SIM_DEVICES']", "envs", "envs",
                     "SIM_DEVICES", id="env"),
        pytest.param(node("/dev/null"), "device_nodes[0].host_path", "device_nodes.host_path",
                     "device_nodes", "/dev/null", id="device-node"),
        pytest.param(mount("/opt/vendor"), "mounts[0].host_path", "mounts.host_path", "mounts",
                     "/opt/vendor", id="mount"),
        pytest.param(ContainerGrant(cdi_devices=("example.com/gpu=0",)), "cdi_devices[0]", "cdi_devices",
                     "cdi_kinds", "example.com/gpu", id="cdi-device"),
        pytest.param(ContainerGrant(annotations={"example.com/a": "x"}), "annotations['example.com/a']",
                     "annotations", "annotation_key_prefixes", "example.com/a", id="annotation"),
    ],
)  # fmt: skip
def test_an_empty_policy_refuses_everything_naming_the_setting_that_would_allow_it(
    grant: ContainerGrant, field: str, kind: str, setting: str, example: str
) -> None:
    """Nothing is allowed unless declared: the refusal says which setting to write, with the
    value to write in it."""
    refused = refusal(policy(), grant)
    assert (refused.field, refused.kind, refused.rule) == (field, kind, undeclared(setting, example))
    # No settings at all is the same empty declaration.
    assert refusal(GrantPolicy(RESOURCE), grant).field == field


def test_an_empty_grant_passes_an_empty_policy() -> None:
    policy().check(ContainerGrant())


def test_a_refusal_is_permission_denied_naming_resource_field_value_and_rule() -> None:
    code, message = grpc_status(refusal(policy(device_nodes=["/dev/**"]), node("/etc/shadow")))
    assert code is grpc.StatusCode.PERMISSION_DENIED
    assert message == (
        f"{RESOURCE}: grant policy refuses device_nodes[0].host_path '/etc/shadow': "
        + undeclared("device_nodes", "/etc/shadow")
    )


@pytest.mark.parametrize(
    "grant",
    [
        pytest.param(node("/etc/" + "x" * 100_000), id="undeclared-path"),
        pytest.param(node("/dev/../etc/" + "x" * 100_000), id="normalised-path"),
        pytest.param(ContainerGrant(envs={"X" * 100_000: "1"}), id="env-name"),
        pytest.param(ContainerGrant(annotations={"x" * 100_000: "1"}), id="annotation-key"),
        pytest.param(ContainerGrant(cdi_devices=("example.com/" + "x" * 100_000 + "=0",)), id="cdi-kind"),
    ],
)
def test_a_huge_offending_value_is_cut_short_in_the_message(grant: ContainerGrant) -> None:
    """gRPC details travel in a header block of a few KiB: the driver's value is cut short
    wherever the message quotes it, the value and the rule's example alike."""
    message = str(refusal(policy(device_nodes=["/dev/**"]), grant))
    assert len(message) < 1000 and message.endswith("...]")


def test_a_later_entry_is_checked_and_named_by_its_index() -> None:
    """The first node passes, the second does not: the field names index 1."""
    grant = ContainerGrant(
        device_nodes=(DeviceNode("/dev/a", "/dev/null"), DeviceNode("/dev/b", "/dev/zero"))
    )
    refused = refusal(policy(device_nodes=["/dev/null"]), grant)
    assert (refused.field, refused.value) == ("device_nodes[1].host_path", "/dev/zero")


def test_a_refused_grant_object_is_refused_again() -> None:
    """What a grant says is judged once per grant object; a refusal is never what is kept."""
    check = policy(envs=["SIM_*"])
    grant = ContainerGrant(envs={"SIM_DEVICES": "0", "OTHER": "1"})
    assert refusal(check, grant).field == "envs['OTHER']"
    assert refusal(check, grant).field == "envs['OTHER']"


def test_a_grant_inside_every_declaration_passes(devices: Path) -> None:
    check = policy(
        envs=["GPU_IDS", "SIM_*"],
        device_nodes=["/dev/null", f"{devices}/*"],
        mounts=[f"{devices}/dir"],
        annotation_key_prefixes=["example.com/"],
        cdi_kinds=["example.com/gpu"],
    )
    check.check(
        ContainerGrant(
            envs={"GPU_IDS": "0,1", "SIM_DEVICES": "0"},
            mounts=(Mount("/opt/x", str(devices / "dir"), True),),
            device_nodes=(
                DeviceNode("/dev/a", "/dev/null", "r"),
                DeviceNode("/dev/b", str(devices / "null")),
            ),
            annotations={"example.com/a": "b"},
            cdi_devices=("example.com/gpu=0",),
        )
    )


# --- device nodes: escapes, links, what a node is ------------------------------------------------


@pytest.mark.parametrize(
    ("host_path", "rule"),
    [
        pytest.param("/etc/shadow", undeclared("device_nodes", "/etc/shadow"), id="outside"),
        pytest.param("/dev/../etc/passwd", "it normalises to '/etc/passwd', not declared", id="dotdot"),
        pytest.param("/dev//../etc/passwd", "it normalises to '/etc/passwd'", id="double-slash-dotdot"),
        pytest.param("/dev/./../etc", "it normalises to '/etc'", id="dot-dotdot"),
        pytest.param("//etc/passwd", "it normalises to '/etc/passwd'", id="leading-double-slash"),
        pytest.param("/devil", undeclared("device_nodes", "/devil"), id="glob-is-not-a-string-prefix"),
        pytest.param("/dev-evil/x", undeclared("device_nodes", "/dev-evil/x"), id="glob-dash"),
        pytest.param("/dev", undeclared("device_nodes", "/dev"), id="the-tree-itself"),
        pytest.param("/", undeclared("device_nodes", "/"), id="root"),
        pytest.param("dev/null", "not an absolute path", id="relative"),
        pytest.param("./dev/null", "not an absolute path", id="dot-relative"),
        pytest.param("", "not an absolute path", id="empty"),
        pytest.param("/dev/null\x00/etc/shadow", "a NUL byte in a path", id="nul"),
        pytest.param("/dev/fd", "it resolves to '/proc/", id="dev-fd-into-proc"),
        pytest.param("/dev/fd/../../etc/passwd", "it normalises to '/etc/passwd'", id="dev-fd-dotdot"),
    ],
)
def test_escapes_from_a_declared_glob_are_refused_naming_the_field_and_the_rule(
    host_path: str, rule: str
) -> None:
    """Each classic escape fails with the field, the offending value and the rule, however
    broad the glob."""
    refused = refusal(policy(device_nodes=["/dev/**"]), node(host_path))
    assert refused.field == "device_nodes[0].host_path"
    assert refused.kind == "device_nodes.host_path"
    assert refused.value == host_path
    assert rule in refused.rule
    assert str(refused).startswith(f"{RESOURCE}: grant policy refuses device_nodes[0].host_path ")


@pytest.mark.parametrize(
    "host_path", ["/dev/null", "/dev/zero", "/dev/full", "/dev/urandom", "/dev/stdin/../null"]
)
def test_character_devices_under_a_declared_glob_pass(host_path: str) -> None:
    policy(device_nodes=["/dev/**"]).check(node(host_path))


def test_a_dev_fd_link_to_an_open_file_is_refused_where_it_leads(tmp_path: Path) -> None:
    """/dev/fd/N is a symlink into /proc that leads to whatever the process has open."""
    secret = tmp_path / "secret"
    secret.write_text("x")
    fd = os.open(secret, os.O_RDONLY)
    try:
        refused = refusal(policy(device_nodes=["/dev/**"]), node(f"/dev/fd/{fd}"))
    finally:
        os.close(fd)
    assert refused.rule == f"it resolves to {str(secret)!r}, which is not declared in {WHERE}.device_nodes"


def test_a_dev_fd_link_to_a_pipe_is_refused() -> None:
    """/dev/stdin and friends may lead to a pipe, which is no path at all (pipe:[inode])."""
    read, write = os.pipe()
    try:
        refused = refusal(policy(device_nodes=["/dev/**"]), node(f"/dev/fd/{read}"))
    finally:
        os.close(read)
        os.close(write)
    assert "pipe:[" in refused.rule and "which is not declared in" in refused.rule


def test_a_link_devshim_may_not_read_is_refused() -> None:
    """Where another namespace's /proc/PID/root leads is unknown to devshim (without
    CAP_SYS_PTRACE): refused, not an internal error."""
    try:
        os.readlink("/proc/1/root")
    except PermissionError:
        pass
    else:
        pytest.skip("this process may read /proc/1/root")
    check = policy(device_nodes=["/**"], mounts=["/**"], unsafe={"mount.kernel": True})
    for grant in (node("/proc/1/root/dev/null"), mount("/proc/1/root/opt")):
        assert refusal(check, grant).rule == "where it leads cannot be looked up (Permission denied)"


@pytest.mark.parametrize("name", ["dev0", "inner", "sub/../dev0"])
def test_paths_under_a_glob_that_stay_inside_it_are_allowed(tree: Path, name: str) -> None:
    """A plain node, a symlink to a node inside, and a '..' that stays inside all pass."""
    in_tree(device_nodes=[f"{tree}/allowed/**"]).check(node(f"{tree}/allowed/{name}"))


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
def test_symlinks_under_a_glob_that_lead_outside_are_refused(tree: Path, name: str, leads_to: str) -> None:
    """Whatever the route out of the glob, where the path leads is what is judged."""
    check = in_tree(device_nodes=[f"{tree}/allowed/**"], mounts=[f"{tree}/allowed/**"])
    refused = refusal(check, node(f"{tree}/allowed/{name}"))
    assert refused.rule == (
        f"it resolves to {str(tree / leads_to)!r}, which is not declared in {WHERE}.device_nodes"
    )
    assert refusal(check, mount(f"{tree}/allowed/{name}")).rule == (
        f"it resolves to {str(tree / leads_to)!r}, which is not declared in {WHERE}.mounts"
    )


def test_the_walk_that_notes_each_link_lands_where_realpath_does(tree: Path) -> None:
    """The policy walks links itself, to know the directory of each one it follows."""
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
        assert Looks().follow(path)[0] == os.path.realpath(path), path
    assert Looks().follow(f"{tree}/allowed/chain")[1] == (str(tree / "allowed"),) * 3


def test_a_symlink_repointed_after_a_check_is_refused_on_the_next_call(tree: Path) -> None:
    """Where a path leads is never cached, not even for the same grant object (a declared
    grant is handed out again as the same object, and what it says is judged once): a link
    that was inside on one Allocate and outside on the next is refused the second time."""
    check = in_tree(device_nodes=[f"{tree}/allowed/*"])
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


def test_a_glob_whose_head_is_a_symlink_also_allows_where_it_leads(tree: Path) -> None:
    """An operator's /var/run/x/* (with /var/run a link to /run) allows what resolves under /run/x."""
    in_tree(device_nodes=[f"{tree}/via/*"]).check(node(f"{tree}/via/dev0"))
    # Only the head the operator wrote: a link below it is judged on every call.
    refused = refusal(in_tree(device_nodes=[f"{tree}/via/*"]), node(f"{tree}/via/out"))
    assert f"resolves to {str(tree / 'secret' / 'key')!r}" in refused.rule


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
    refused = refusal(policy(device_nodes=[f"{devices}/*"]), node(str(devices / name)))
    assert refused.rule == (
        f"{str(devices / name)!r} {said}, and {WHERE}.device_node_types allows char devices only"
    )
    assert refused.kind == "device_nodes.host_path"


def test_block_devices_pass_where_the_policy_allows_them_and_anything_where_it_says_null(
    devices: Path,
) -> None:
    policy(device_nodes=[f"{devices}/*"], device_node_types=["char", "block"]).check(
        node(str(devices / "disk"))
    )
    only_block = refusal(
        policy(device_nodes=[f"{devices}/*"], device_node_types=["block"]), node(str(devices / "null"))
    )
    assert only_block.rule.endswith(f"{WHERE}.device_node_types allows block devices only")
    anything = policy(device_nodes=[f"{devices}/*"], device_node_types=None)
    for name in ("disk", "file", "dir", "absent"):
        anything.check(node(str(devices / name)))


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm on this machine")
def test_a_link_in_dev_shm_is_refused_before_anyone_can_repoint_it() -> None:
    """/dev/shm is world-writable: a link there to /dev/null, approved, could be repointed to
    /etc/shadow by anyone before the runtime opens it. Refused at once, under /dev/** too."""
    link = Path("/dev/shm") / f"devshim-test-{os.getpid()}"
    link.symlink_to("/dev/null")
    try:
        refused = refusal(policy(device_nodes=["/dev/**"]), node(str(link)))
        policy(device_nodes=["/dev/**"], allow_world_writable_dirs=True).check(node(str(link)))
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
    check = policy(device_nodes=[f"{devices}/**"], mounts=[f"{devices}/**"])
    for path in ("null", "shared/null", "via-shared"):
        check.check(node(str(devices / path)))
    check.check(mount(str(shared / "hop")))
    shared.chmod(0o1777)  # sticky or not: anyone may add a name, or repoint their own link
    for grant in (node(str(shared / "null")), node(str(devices / "via-shared")), mount(str(shared / "hop"))):
        assert refusal(check, grant).rule == f"it passes through {str(shared)!r}, {WORLD_WRITABLE}"
    policy(device_nodes=[f"{devices}/**"], allow_world_writable_dirs=True).check(
        node(str(devices / "via-shared"))
    )
    # A temp dir lies below /tmp: refused however deep below.
    make_node(tmp_path / "null", stat.S_IFCHR, 1, 3)
    below_tmp = refusal(policy(device_nodes=[f"{tmp_path}/*"]), node(str(tmp_path / "null")))
    assert below_tmp.rule == f"it passes through '/tmp', {WORLD_WRITABLE}"


@pytest.mark.parametrize(
    ("container_path", "rule"),
    [
        pytest.param("dev/x", "not an absolute path", id="relative"),
        pytest.param("/dev/../etc/x", "'..' in a container path", id="dotdot"),
        pytest.param("/dev/x/..", "'..' in a container path", id="trailing-dotdot"),
        pytest.param("/dev/x\x00", "a NUL byte in a path", id="nul"),
    ],
)
def test_container_paths_must_be_absolute_without_dotdot(container_path: str, rule: str) -> None:
    check = policy(device_nodes=["/dev/null"], mounts=["/opt/vendor"])
    refused = refusal(check, node("/dev/null", container_path))
    assert (refused.field, refused.kind, refused.rule) == (
        "device_nodes[0].container_path",
        "device_nodes.container_path",
        rule,
    )
    refused = refusal(check, mount("/opt/vendor", container_path))
    assert (refused.field, refused.kind, refused.rule) == (
        "mounts[0].container_path",
        "mounts.container_path",
        rule,
    )


@pytest.mark.parametrize("permissions", ["rwx", "", "rwmr", "RW", "r w"])
def test_device_permissions_other_than_rwm_are_refused(permissions: str) -> None:
    """A driver's permissions are held to the cgroup's access letters, as static settings are."""
    refused = refusal(policy(device_nodes=["/dev/null"]), node("/dev/null", permissions=permissions))
    assert (refused.field, refused.rule) == ("device_nodes[0].permissions", "not 1-3 of r, w, m")


@pytest.mark.parametrize("permissions", ["r", "w", "m", "rw", "rwm", "mwr"])
def test_device_permissions_of_rwm_pass(permissions: str) -> None:
    policy(device_nodes=["/dev/null"]).check(node("/dev/null", permissions=permissions))


# --- mounts ------------------------------------------------------------------------------------


def test_a_read_only_mount_under_a_glob_passes_and_a_writable_one_needs_saying_so(tree: Path) -> None:
    check = in_tree(mounts=[f"{tree}/allowed/**"])
    check.check(mount(f"{tree}/allowed/sub"))
    refused = refusal(check, mount(f"{tree}/allowed/sub", read_only=False))
    assert (refused.field, refused.kind) == ("mounts[0].read_only", "mounts.read_only")
    assert refused.rule == f"mounts must be read-only ({WHERE}.read_only_mounts)"
    in_tree(mounts=[f"{tree}/allowed/**"], read_only_mounts=False).check(
        mount(f"{tree}/allowed/sub", read_only=False)
    )


def test_mount_host_paths_get_the_same_escape_checks(tree: Path) -> None:
    check = in_tree(mounts=[f"{tree}/allowed/**"])
    for host_path in (
        f"{tree}/allowed/outdir",
        f"{tree}/allowed/../secret",
        f"{tree}/allowedx",
        "opt",
        "/o\x00",
    ):
        assert refusal(check, mount(host_path)).field == "mounts[0].host_path", host_path
    assert refusal(check, mount(f"{tree}/allowed/sub", "/opt/../etc")).field == "mounts[0].container_path"


def test_device_globs_do_not_allow_mounts_there_nor_mount_globs_nodes() -> None:
    """Mounts have globs of their own: /opt/vendor/** for nodes does not let a driver mount there."""
    refused = refusal(policy(device_nodes=["/opt/vendor/**"]), mount("/opt/vendor/x"))
    assert refused.rule == undeclared("mounts", "/opt/vendor/x")
    refused = refusal(policy(mounts=["/opt/vendor/**"]), node("/opt/vendor/x"))
    assert refused.rule == undeclared("device_nodes", "/opt/vendor/x")


# --- envs, annotations, CDI ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("envs", "allowed", "refused"),
    [
        pytest.param(
            ["SIM_DEVICES"], ["SIM_DEVICES"], ["SIM_DEVICES2", "XSIM_DEVICES", "sim_devices"], id="exact"
        ),
        pytest.param(
            ["NVIDIA_*"], ["NVIDIA_", "NVIDIA_VISIBLE_DEVICES"], ["NVIDIA", "XNVIDIA_X"], id="prefix"
        ),
        pytest.param(["*"], ["A", "SIM_DEVICES", "_X1"], [], id="any"),
    ],
)
def test_env_entries_allow_exact_names_prefixes_or_any(
    envs: list[str], allowed: list[str], refused: list[str]
) -> None:
    check = policy(envs=envs)
    for name in allowed:
        check.check(ContainerGrant(envs={name: "1"}))
    for name in refused:
        assert refusal(check, ContainerGrant(envs={name: "1"})).rule == undeclared("envs", name)


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("1ST", id="leading-digit"),
        pytest.param("A=B", id="equals"),
        pytest.param("A B", id="space"),
        pytest.param("", id="empty"),
        pytest.param("A-B", id="dash"),
        # re.match with "$" would let a final newline past.
        pytest.param("SIM_DEVICES\n", id="trailing-newline"),
    ],
)
def test_what_is_no_env_name_is_refused_even_under_a_star(name: str) -> None:
    refused = refusal(policy(envs=["*"]), ContainerGrant(envs={"OK": "1", name: "x"}))
    assert refused.field == f"envs[{name!r}]"
    assert refused.rule == "not an env name (letters, digits and '_', not starting with a digit)"


def test_annotations_are_allowed_by_key_prefix_as_plain_strings() -> None:
    check = policy(annotation_key_prefixes=["example.com/"])
    check.check(ContainerGrant(annotations={"example.com/owner": "devshim"}))
    refused = refusal(check, ContainerGrant(annotations={"example.com.evil.io/x": "1"}))
    assert refused.rule == undeclared("annotation_key_prefixes", "example.com.evil.io/x")


@pytest.mark.parametrize(
    ("kinds", "name", "ok"),
    [
        pytest.param(["nvidia.com/x"], "nvidia.com/x=0", True, id="the-kind"),
        # The attack 4: a driver serving nvidia.com/x hands out every GPU.
        pytest.param(["nvidia.com/x"], "nvidia.com/gpu=all", False, id="another-class-of-the-vendor"),
        pytest.param(["example.com/gpu"], "example.com/gpu=all", True, id="all-of-the-kind"),
        pytest.param(["example.com/gpu"], "example.com/gpu2=0", False, id="class-as-string-prefix"),
        pytest.param(["example.com/*"], "example.com/gpu=0", True, id="vendor-star"),
        pytest.param(["example.com/*"], "example.com/nic=1", True, id="vendor-star-other-class"),
        pytest.param(["example.com/*"], "other.com/gpu=0", False, id="vendor-star-other-vendor"),
        pytest.param(["example.com/*"], "example.com.evil.io/gpu=0", False, id="vendor-as-string-prefix"),
        pytest.param(["example.com/*"], "gpu.example.com/x=0", False, id="sub-domain"),
        pytest.param(["*"], "anyone.io/thing=1", True, id="star"),
        pytest.param([], "example.com/gpu=0", False, id="none-declared"),
    ],
)
def test_cdi_devices_must_be_of_a_declared_kind(kinds: list[str], name: str, ok: bool) -> None:
    """A resource's name implies no CDI kind: only what cdi_kinds declares."""
    check = policy(cdi_kinds=kinds)
    grant = ContainerGrant(cdi_devices=(name,))
    if ok:
        check.check(grant)
    else:
        refused = refusal(check, grant)
        assert (refused.field, refused.rule) == (
            "cdi_devices[0]",
            undeclared("cdi_kinds", name.partition("=")[0]),
        )


@pytest.mark.parametrize(
    "name", ["example.com", "example.com/gpu=", "example.com/=0", "/gpu=0", "example.com/g pu=0", "=0", ""]
)
def test_what_is_no_cdi_device_name_is_refused_even_under_a_star(name: str) -> None:
    refused = refusal(policy(cdi_kinds=["*"]), ContainerGrant(cdi_devices=(name,)))
    assert refused.rule == "not a CDI device name 'vendor/class=name'"


def test_cdi_annotations_are_held_to_the_cdi_kinds() -> None:
    """containerd and CRI-O inject the CDI devices a cdi.k8s.io/ annotation names: the same
    kinds as cdi_devices, or the annotation would be a way around that rule."""
    check = policy(annotation_key_prefixes=["cdi.k8s.io/"], cdi_kinds=["nvidia.com/x"])
    check.check(ContainerGrant(annotations={"cdi.k8s.io/p_0": "nvidia.com/x=0, nvidia.com/x=1"}))
    refused = refusal(
        check, ContainerGrant(annotations={"cdi.k8s.io/p_0": "nvidia.com/x=0,nvidia.com/gpu=all"})
    )
    assert (refused.field, refused.kind) == ("annotations['cdi.k8s.io/p_0']", "annotations")
    assert refused.rule == undeclared("cdi_kinds", "nvidia.com/gpu")
    # Under any annotation key at all, the kinds still hold.
    anything = policy(annotation_key_prefixes=["cdi.k8s.io/"], cdi_kinds=["nvidia.com/*"])
    anything.check(ContainerGrant(annotations={"cdi.k8s.io/a": "nvidia.com/gpu=all"}))
    assert (
        "cdi_kinds" in refusal(anything, ContainerGrant(annotations={"cdi.k8s.io/a": "amd.com/gpu=0"})).rule
    )
    bad = refusal(anything, ContainerGrant(annotations={"cdi.k8s.io/a": "nvidia.com/gpu"}))
    assert bad.rule == "not a CDI device name 'vendor/class=name'"


# --- settings ------------------------------------------------------------------------------------


def driver(policy_settings: Any, **more: Any) -> dict[str, Any]:
    return {"name": "sim", "command": ["x"], "resources": [RESOURCE], "policy": policy_settings, **more}


@pytest.mark.parametrize(
    ("policy_settings", "where", "said"),
    [
        pytest.param({"envs": ["SIM_DEVICES", "A B"]}, "envs[1]", "is not an env name", id="env-space"),
        pytest.param({"envs": ["*_X"]}, "envs[0]", "is not an env name", id="env-star-first"),
        pytest.param({"envs": ["A*B"]}, "envs[0]", "is not an env name", id="env-star-inside"),
        pytest.param({"device_nodes": ["dev/*"]}, "device_nodes[0]", "is not an absolute path", id="rel"),
        pytest.param({"mounts": ["/opt", "/a/../b"]}, "mounts[1]", "is not a normalised path", id="dotdot"),
        pytest.param({"mounts": ["/a/./b"]}, "mounts[0]", "is not a normalised path", id="dot"),
        pytest.param({"mounts": ["//a"]}, "mounts[0]", "is not a normalised path", id="double-slash"),
        pytest.param({"mounts": ["/opt/"]}, "mounts[0]", "is not a normalised path", id="trailing-slash"),
        pytest.param({"device_nodes": ["/dev\x00"]}, "device_nodes[0]", "a NUL byte", id="nul"),
        pytest.param({"cdi_kinds": ["a.com/x=y"]}, "cdi_kinds[0]", "is not a CDI kind", id="cdi-name"),
        pytest.param({"cdi_kinds": ["a.com"]}, "cdi_kinds[0]", "is not a CDI kind", id="cdi-vendor-alone"),
        pytest.param({"cdi_kinds": ["*/gpu"]}, "cdi_kinds[0]", "is not a CDI kind", id="cdi-star-vendor"),
        pytest.param({"annotation_key_prefixes": [""]}, "annotation_key_prefixes[0]", "at least 1",
                     id="empty-prefix"),
        pytest.param({"unsafe": {"env.all": True}}, "unsafe.env.all.[key]", "Input should be", id="unsafe"),
        pytest.param({"device_node_types": ["pipe"]}, "device_node_types[0]", "Input should be", id="type"),
        pytest.param({"mounts_ok": True}, "mounts_ok", "Extra inputs", id="unknown-field"),
    ],
)  # fmt: skip
def test_bad_policy_settings_are_refused_naming_the_yaml_path(
    policy_settings: dict[str, Any], where: str, said: str
) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.load(drivers=[driver(policy_settings)])
    assert f"drivers[0].policy.{where}: " in str(info.value)
    assert said in str(info.value)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("device_path_prefixes", "device_nodes (host path globs"),
        ("mount_path_prefixes", "mounts (host path globs"),
        ("env_name_pattern", "envs (the names allowed"),
        ("denied_env_names", "envs (an allowlist) and the floor's rules (unsafe)"),
        ("denied_device_numbers", "device_nodes (an allowlist) and the floor's rules (unsafe)"),
        ("denied_container_path_prefixes", "the floor's container_path.system rule (unsafe)"),
        ("cdi_vendor_prefixes", "cdi_kinds (e.g."),
    ],
)
def test_a_setting_of_the_denylist_design_is_refused_naming_its_replacement(old: str, new: str) -> None:
    """An operator's old policy must not load as an empty one silently, nor as anything else."""
    message = f"{old} is no longer a setting: grants are denied unless declared, with {new}"
    with pytest.raises(ValueError, match=r"no longer a setting") as direct:
        GrantPolicySettings.model_validate({old: []})
    assert message in str(direct.value)
    with pytest.raises(ConfigError) as loaded:
        Settings.load(drivers=[driver({"envs": ["SIM_DEVICES"], old: []})])
    assert "drivers[0].policy: " in str(loaded.value) and message in str(loaded.value)


def test_the_defaults_documented_in_docs_configuration_md_are_the_real_ones() -> None:
    """The "Grant policy" section's declaration "with every key shown" is the default, field
    for field."""
    text = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    section = text.split("## Grant policy", 1)[1]
    blocks = [b.split("```", 1)[0] for b in section.split("```yaml\n")[1:]]
    block = next(b for b in blocks if b.startswith("policy:"))
    documented = yaml.safe_load(block)["policy"]
    assert set(documented) == set(GrantPolicySettings.model_fields)
    assert GrantPolicySettings(**documented) == GrantPolicySettings()


def test_lifted_lists_the_floor_rules_switched_on_only() -> None:
    settings = GrantPolicySettings(unsafe={"device.tpm": True, "env.shell": False, "env.loader": True})
    assert settings.lifted() == ["device.tpm", "env.loader"]
    assert policy(unsafe={"env.shell": False}).floor.lifted == ()


def test_a_driver_resource_policy_replaces_the_driver_policy_whole() -> None:
    """Nothing widens by inheritance; each refusal names the setting it was read from."""
    settings = Settings.load(
        drivers=[
            {
                "name": "sim",
                "command": ["x"],
                "resources": [RESOURCE, "example.com/nic"],
                "policy": {"annotation_key_prefixes": ["example.com/"]},
                "resource_policies": {"example.com/nic": {"mounts": ["/opt/nic"]}},
            }
        ]
    )
    sim = settings.drivers[0]
    gpu = sim.grant_policy(RESOURCE)
    assert (gpu.where, gpu.settings.annotation_key_prefixes) == (WHERE, ["example.com/"])
    nic = sim.grant_policy("example.com/nic")
    assert nic.where == "drivers[sim].resource_policies[example.com/nic]"
    assert (nic.settings.mounts, nic.settings.annotation_key_prefixes) == (["/opt/nic"], [])
    assert "drivers[sim].resource_policies[example.com/nic].annotation_key_prefixes" in (
        refusal(nic, ContainerGrant(annotations={"example.com/a": "1"})).rule
    )


def test_a_resource_policy_key_must_be_among_the_drivers_resources() -> None:
    with pytest.raises(ConfigError, match=r"resource_policies names example.com/nic, not in this driver's"):
        Settings.load(drivers=[driver({}, resource_policies={"example.com/nic": {}})])


@pytest.mark.parametrize(
    ("static", "policy_settings", "said"),
    [
        pytest.param(
            {"count": 2, "grant": {"mounts": [{"container_path": "/o", "host_path": "/opt/x"}]}},
            {},
            "static.grant for device 'dev0': mounts[0].host_path '/opt/x' is outside the resource's policy: "
            f"not declared: resources[{RESOURCE}].policy.mounts would allow it, e.g. [/opt/x]",
            id="an-empty-policy-allows-nothing",
        ),
        pytest.param(
            {
                "devices": [{"id": "gpu0"}, {"id": ".."}],
                "grant": {"device_nodes": [{"container_path": "/dev/g", "host_path": "/dev/{id}"}]},
            },
            None,
            "static.grant for device '..': device_nodes[0].host_path '/dev/..' is outside the resource's "
            f"policy: it normalises to '/', not declared: resources[{RESOURCE}].policy.device_nodes",
            id="an-id-in-a-path",
        ),
        pytest.param(
            {"count": 1, "grant": {"envs": {"LD_PRELOAD": "/x.so"}}},
            None,
            "envs['LD_PRELOAD'] 'LD_PRELOAD' is outside the resource's policy: the floor's rule env.loader",
            id="the-floor-under-its-own-declaration",
        ),
    ],
)
def test_a_static_grant_outside_its_policy_is_a_config_error(
    static: dict[str, Any], policy_settings: dict[str, Any] | None, said: str
) -> None:
    """Caught when the config loads, naming the resource and the device, not at the first Allocate."""
    resource = {"name": RESOURCE, "static": static, "policy": policy_settings}
    with pytest.raises(ConfigError) as info:
        Settings.load(resources=[resource])
    assert "resources[0]" in str(info.value) and said in str(info.value)


def test_a_static_resource_without_a_policy_declares_exactly_its_grant() -> None:
    grant = {
        "envs": {"SIM_DEVICES": "{id}"},
        "device_nodes": [{"container_path": "/dev/g", "host_path": "/dev/sim-{id}"}],
        "mounts": [{"container_path": "/o", "host_path": "/opt//x", "read_only": True}],
        "cdi_devices": ["example.com/gpu={id}"],
    }
    settings = Settings.load(resources=[{"name": RESOURCE, "static": {"count": 1, "grant": grant}}])
    declared = settings.resources[0].grant_policy().settings
    assert declared == GrantPolicySettings(
        envs=["SIM_DEVICES"], device_nodes=["/dev/sim-*"], mounts=["/opt/x"], cdi_kinds=["example.com/gpu"]
    )


# --- in the core: Allocate -----------------------------------------------------------------------


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
    grant = GrantSettings(mounts=[MountSettings(container_path="/opt/x", host_path="/opt/x", read_only=True)])
    source = RecordingSource([Device("d0"), Device("d1")], grant)
    service = ResourceService(RESOURCE, source, driver="sim", policy=policy())
    await service.start()
    before = refusals("mounts.host_path")
    try:
        with pytest.raises(GrantRefused) as info:
            await service.allocate([ContainerAllocateRequest(("d0", "d1"))])
        async with asyncio.timeout(10):
            while not source.freed:
                await asyncio.sleep(0.01)
    finally:
        await service.stop()
    assert info.value.field == "mounts[0].host_path"
    assert refusals("mounts.host_path") == before + 1
    assert [m for m in warnings if "outside the policy" in m] == [
        f"{RESOURCE}: driver 'sim' granted mounts[0].host_path '/opt/x' outside the policy "
        f"({undeclared('mounts', '/opt/x')}); Allocate refused"
    ]
    assert source.freed == [("d0", "d1")]


async def test_allocate_inside_the_policy_is_answered() -> None:
    grant = GrantSettings(mounts=[MountSettings(container_path="/opt", host_path="/opt", read_only=True)])
    service = ResourceService(RESOURCE, StaticSource([Device("d0")], grant), policy=policy(mounts=["/opt"]))
    await service.start()
    try:
        [answer] = await service.allocate([ContainerAllocateRequest(("d0",))])
    finally:
        await service.stop()
    assert answer.mounts == (Mount("/opt", "/opt", True),)


def test_compat_relaxed_allows_any_grant_at_all(devices: Path) -> None:
    """`compat --relaxed` judges how a driver speaks, not what a node allows: its settings with
    the allowlists not held must let through a grant that breaks every rule there is (a rule
    added to the policy must be relaxed there too)."""
    shm = Path("/dev/shm") / f"devshim-test-relaxed-{os.getpid()}"
    shm.symlink_to("/dev/null")
    relaxed = GrantPolicy(RESOURCE, GrantPolicySettings(**ALLOW_ANY_GRANT), WHERE, declared=False)
    try:
        relaxed.check(
            ContainerGrant(
                envs={"LD_PRELOAD": "x", "SHELLOPTS": "xtrace", "PYTHONPATH": "/x", "ANYTHING": "1"},
                mounts=(Mount("/etc", "/", False), Mount("/usr/lib/x", "/var/run/secrets", False)),
                device_nodes=(
                    DeviceNode("/dev/kmsg", "/dev/kmsg", "rwm"),
                    DeviceNode("/dev/b", str(devices / "disk")),
                    DeviceNode("/dev/c", str(devices / "file")),
                    DeviceNode("/dev/d", str(shm)),
                    DeviceNode("/dev/e", "/dev/pts/0"),
                ),
                annotations={"anything/at-all": "1", "cdi.k8s.io/x": "anyone.io/thing=0"},
                cdi_devices=("nvidia.com/gpu=all",),
            )
        )
    finally:
        shm.unlink()
