"""The floor: what no allowlist lets through, however broad, unless ``unsafe`` lifts that one rule.

Every attack here is refused under the broadest declaration there is (``envs: ["*"]``,
``device_nodes: ["/dev/**"]``, ``mounts: ["/**"]``), naming the floor rule that refuses it; and
each is let through by exactly its own ``unsafe: {RULE: true}``, never another rule's. Device
nodes are caught by path as written, by where a link leads, by number (a node made with mknod
under an innocent name), and by the kernel driver /proc/devices says holds their major.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import pytest

from shim.model import ContainerGrant, DeviceNode, Mount
from shim.policy import RULES, FloorRule, GrantPolicy, GrantPolicySettings, Suggestion
from shim.policy.floor import DEVICE_RULES, ENV_RULES, MOUNT_RULES
from shim.policy.paths import PROC_DEVICES, literal_head, read_proc_devices
from tests.unit.test_policy import RESOURCE, WHERE, make_node, mount, node, private_dir, refusal, undeclared

BROADEST: dict[str, Any] = {"envs": ["*"], "device_nodes": ["/dev/**"], "mounts": ["/**"], "cdi_kinds": ["*"]}


def broad(**settings: Any) -> GrantPolicy:
    return GrantPolicy(RESOURCE, GrantPolicySettings(**{**BROADEST, **settings}), WHERE)


WHY: dict[str, str] = {name: rule.why for name, rule in RULES.items()}


def floor_says(rule: str) -> str:
    lifted_by = f"only {WHERE}.unsafe: {{{rule}: true}} lifts it"
    return f"the floor's rule {rule} refuses it ({WHY[rule]}); {lifted_by}"


def envs(*names: str) -> ContainerGrant:
    return ContainerGrant(envs=dict.fromkeys(names, "x"))


# --- envs ----------------------------------------------------------------------------------------

# The attacks: each runs code of the driver's choosing in the container.
ENV_ATTACKS = [
    pytest.param({"SHELLOPTS": "xtrace", "PS4": "$(cmd)"}, "env.shell", id="shellopts-xtrace-ps4"),
    pytest.param({"PS4": "$(cmd)"}, "env.shell", id="ps4"),
    pytest.param({"BASH_ENV": "/x.sh"}, "env.shell", id="bash-env"),
    pytest.param({"LUA_INIT": "os.execute('x')"}, "env.interpreter", id="lua-init"),
    pytest.param(
        {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "core.pager", "GIT_CONFIG_VALUE_0": "x"},
        "env.interpreter",
        id="git-config",
    ),
    pytest.param({"GIT_CONFIG_KEY_0": "core.fsmonitor"}, "env.interpreter", id="git-config-key"),
    pytest.param({"LESSOPEN": "|x %s"}, "env.interpreter", id="lessopen"),
    pytest.param({"PERLLIB": "/x"}, "env.interpreter", id="perllib"),
    pytest.param({"PERL5OPT": "-Mx"}, "env.interpreter", id="perl5opt"),
    pytest.param({"OPENSSL_CONF": "/x.cnf"}, "env.interpreter", id="openssl-conf"),
    pytest.param({"NODE_PATH": "/x"}, "env.interpreter", id="node-path"),
    pytest.param({"NODE_OPTIONS": "--require /x.js"}, "env.interpreter", id="node-options"),
    pytest.param({"CLASSPATH": "/x.jar"}, "env.interpreter", id="classpath"),
    pytest.param({"DOTNET_STARTUP_HOOKS": "/x.dll"}, "env.interpreter", id="dotnet-startup-hooks"),
    pytest.param({"JAVA_TOOL_OPTIONS": "-javaagent:/x.jar"}, "env.interpreter", id="java-tool-options"),
    pytest.param({"PYTHONSTARTUP": "/x.py"}, "env.interpreter", id="pythonstartup"),
    pytest.param({"PYTHONPATH": "/x"}, "env.interpreter", id="pythonpath"),
    pytest.param({"VENDOR_OPTS": "-x"}, "env.interpreter", id="any-opts"),
    pytest.param({"LD_PRELOAD": "/x.so"}, "env.loader", id="ld-preload"),
    pytest.param({"LD_LIBRARY_PATH": "/x"}, "env.loader", id="ld-library-path"),
    pytest.param({"GCONV_PATH": "/x"}, "env.loader", id="gconv-path"),
    pytest.param({"PATH": "/x"}, "env.shell", id="path"),
]
ENV_RULE_NAMES = [rule.name for rule in ENV_RULES]


@pytest.mark.parametrize(("values", "rule"), ENV_ATTACKS)
def test_env_attacks_are_refused_under_any_env_allowlist_naming_the_rule(
    values: dict[str, str], rule: str
) -> None:
    """``envs: ["*"]`` is a declaration written too broadly; the floor still refuses."""
    grant = ContainerGrant(envs=values)
    first = next(iter(values))
    refused = refusal(broad(), grant)
    assert (refused.field, refused.kind, refused.rule) == (f"envs[{first!r}]", "envs", floor_says(rule))
    # Each of its variables alone is refused too, by a prefix as well as by a star.
    for name in values:
        assert refusal(broad(envs=[name[:2] + "*"]), envs(name)).rule.startswith(f"the floor's rule {rule} ")


@pytest.mark.parametrize(("values", "rule"), ENV_ATTACKS)
def test_an_env_attack_is_let_through_by_its_own_rule_lifted_and_no_other(
    values: dict[str, str], rule: str
) -> None:
    grant = ContainerGrant(envs=values)
    broad(unsafe={rule: True}).check(grant)
    others = {other: True for other in RULES if other != rule}
    assert refusal(broad(unsafe=others), grant).rule == floor_says(rule)
    # unsafe lifts the floor, not the declaration: the name must still be declared.
    first = next(iter(values))
    assert refusal(broad(envs=[], unsafe={rule: True}), grant).rule == undeclared("envs", first)


@pytest.mark.parametrize(
    "name", ["SIM_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "OPTS", "LDX"]
)
def test_names_near_the_floor_pass_a_star(name: str) -> None:
    broad().check(envs(name))


# --- device nodes: by path as written ------------------------------------------------------------

DEVICE_ATTACKS = [
    pytest.param("/dev/pts/0", "device.terminal", id="pts"),
    pytest.param("/dev/ptmx", "device.terminal", id="ptmx"),
    pytest.param("/dev/tty", "device.terminal", id="tty"),
    pytest.param("/dev/tty1", "device.terminal", id="tty1"),
    pytest.param("/dev/ttyS0", "device.terminal", id="serial"),
    pytest.param("/dev/console", "device.terminal", id="console"),
    pytest.param("/dev/vcs1", "device.terminal", id="vcs"),
    pytest.param("/dev/uinput", "device.input", id="uinput"),
    pytest.param("/dev/input/event0", "device.input", id="input-event"),
    pytest.param("/dev/hidraw0", "device.input", id="hidraw"),
    pytest.param("/dev/mtd0", "device.flash", id="mtd"),
    pytest.param("/dev/mtdblock0", "device.flash", id="mtdblock"),
    pytest.param("/dev/tpm0", "device.tpm", id="tpm"),
    pytest.param("/dev/tpmrm0", "device.tpm", id="tpmrm"),
    pytest.param("/dev/watchdog", "device.watchdog", id="watchdog"),
    pytest.param("/dev/watchdog0", "device.watchdog", id="watchdog0"),
    pytest.param("/dev/bsg/0:0:0:0", "device.scsi", id="bsg"),
    pytest.param("/dev/sg0", "device.scsi", id="sg"),
    pytest.param("/dev/mem", "device.memory", id="mem"),
    pytest.param("/dev/kmem", "device.memory", id="kmem"),
    pytest.param("/dev/port", "device.memory", id="port"),
    pytest.param("/dev/kmsg", "device.kmsg", id="kmsg"),
    pytest.param("/dev/snapshot", "device.snapshot", id="snapshot"),
    pytest.param("/dev/cpu/0/msr", "device.cpu", id="msr"),
    pytest.param("/dev/cpu/0/cpuid", "device.cpu", id="cpuid"),
    pytest.param("/dev/mapper/control", "device.disk_control", id="dm-control"),
    pytest.param("/dev/loop-control", "device.disk_control", id="loop-control"),
    pytest.param("/dev/./kmsg", "device.kmsg", id="kmsg-normalised"),
]


@pytest.mark.parametrize(("host_path", "rule"), DEVICE_ATTACKS)
def test_device_attacks_are_refused_by_path_under_dev_star_star(host_path: str, rule: str) -> None:
    """By the path as written, whether or not this machine has the node."""
    refused = refusal(broad(device_node_types=None), node(host_path))
    assert (refused.field, refused.kind) == ("device_nodes[0].host_path", "device_nodes.host_path")
    assert refused.rule.endswith(floor_says(rule))


@pytest.mark.parametrize(("host_path", "rule"), DEVICE_ATTACKS)
def test_a_device_attack_is_let_through_by_its_own_rule_lifted_and_no_other(
    host_path: str, rule: str
) -> None:
    """Lifted, its rule lets the node through by path and by number alike (where this machine
    has it); any other rule lifted leaves it refused."""
    broad(device_node_types=None, unsafe={rule: True}).check(node(host_path))
    others = {other: True for other in RULES if other != rule}
    assert refusal(broad(device_node_types=None, unsafe=others), node(host_path)).rule.endswith(
        floor_says(rule)
    )


# --- device nodes: where links lead, and what a node is -----------------------------------------


@pytest.mark.parametrize(("target", "rule"), [("/dev/kmsg", "device.kmsg"), ("/dev/tty", "device.terminal")])
def test_an_innocently_named_link_is_refused_where_it_leads(tmp_path: Path, target: str, rule: str) -> None:
    """tmp/gpu0 -> /dev/kmsg under a glob declaring tmp/**: /dev/kmsg is what the runtime opens."""
    if not os.path.exists(target):
        pytest.skip(f"no {target} on this machine")
    (tmp_path / "gpu0").symlink_to(target)
    check = broad(device_nodes=[f"{tmp_path}/**"], allow_world_writable_dirs=True)
    assert (
        refusal(check, node(str(tmp_path / "gpu0"))).rule
        == f"it resolves to {target!r}, which {floor_says(rule)}"
    )


# Nodes made with mknod under innocent names: only their number says what they are.
BY_NUMBER = [
    pytest.param(stat.S_IFCHR, 1, 1, "device.memory", id="mem"),
    pytest.param(stat.S_IFCHR, 1, 11, "device.kmsg", id="kmsg"),
    pytest.param(stat.S_IFCHR, 4, 0, "device.terminal", id="tty0"),
    pytest.param(stat.S_IFCHR, 4, 64, "device.terminal", id="ttyS0"),
    pytest.param(stat.S_IFCHR, 5, 0, "device.terminal", id="tty"),
    pytest.param(stat.S_IFCHR, 136, 0, "device.terminal", id="pts0"),
    pytest.param(stat.S_IFCHR, 13, 64, "device.input", id="input-event0"),
    pytest.param(stat.S_IFCHR, 10, 223, "device.input", id="uinput"),
    pytest.param(stat.S_IFCHR, 90, 0, "device.flash", id="mtd0"),
    pytest.param(stat.S_IFBLK, 31, 0, "device.flash", id="mtdblock0"),
    pytest.param(stat.S_IFCHR, 10, 224, "device.tpm", id="tpm0"),
    pytest.param(stat.S_IFCHR, 10, 130, "device.watchdog", id="watchdog"),
    pytest.param(stat.S_IFCHR, 21, 0, "device.scsi", id="sg0"),
    pytest.param(stat.S_IFCHR, 10, 236, "device.disk_control", id="dm-control"),
    pytest.param(stat.S_IFCHR, 10, 237, "device.disk_control", id="loop-control"),
    pytest.param(stat.S_IFCHR, 202, 0, "device.cpu", id="msr"),
    pytest.param(stat.S_IFCHR, 10, 231, "device.snapshot", id="snapshot"),
]


@pytest.fixture
def private() -> Iterator[Path]:
    with private_dir() as made:
        yield made


@pytest.mark.parametrize(("kind", "major", "minor", "rule"), BY_NUMBER)
def test_an_innocently_named_node_is_refused_by_its_number(
    private: Path, tmp_path: Path, kind: int, major: int, minor: int, rule: str
) -> None:
    """/run/x/gpu0 made as c 1:11 is /dev/kmsg whatever it is called, and so is a link to it."""
    gpu0 = make_node(private / "gpu0", kind, major, minor)
    kind_name = "character" if kind == stat.S_IFCHR else "block"
    check = broad(device_nodes=[f"{private}/*", f"{tmp_path}/*"], device_node_types=["char", "block"])
    said = f"{str(gpu0)!r} is a {kind_name} device {major}:{minor}, which {floor_says(rule)}"
    assert refusal(check, node(str(gpu0))).rule == said
    (tmp_path / "gpu0").symlink_to(gpu0)
    by_link = broad(
        device_nodes=[f"{private}/*", f"{tmp_path}/*"], device_node_types=None, allow_world_writable_dirs=True
    )
    assert refusal(by_link, node(str(tmp_path / "gpu0"))).rule == said
    broad(device_nodes=[f"{private}/*"], device_node_types=["char", "block"], unsafe={rule: True}).check(
        node(str(gpu0))
    )


@pytest.mark.parametrize(("major", "minor"), [(1, 3), (1, 5), (10, 232), (10, 200), (195, 0), (226, 128)])
def test_nodes_of_other_numbers_pass(private: Path, major: int, minor: int) -> None:
    """null, zero, kvm, tun, an NVIDIA GPU and a render node: what drivers hand out (this
    machine's /proc/devices naming their majors as it will)."""
    gpu0 = make_node(private / "gpu0", stat.S_IFCHR, major, minor)
    broad(device_nodes=[f"{private}/*"]).check(node(str(gpu0)))


# --- device nodes: by the driver /proc/devices names -------------------------------------------


def claiming(tmp_path: Path, text: str, **settings: Any) -> GrantPolicy:
    """A policy reading a /proc/devices-shaped file of ``text`` instead of the kernel's."""
    (tmp_path / "devices").write_text(text)
    declared = GrantPolicySettings(**{"device_nodes": ["/dev/**"], **settings})
    return GrantPolicy(RESOURCE, declared, WHERE, proc_devices=str(tmp_path / "devices"))


@pytest.mark.parametrize(
    ("driver", "rule"),
    [
        ("watchdog", "device.watchdog"),
        ("bsg", "device.scsi"),
        ("sg", "device.scsi"),
        ("tpm", "device.tpm"),
        ("tpmrm", "device.tpm"),
        ("hidraw", "device.input"),
        ("input", "device.input"),
        ("mtd", "device.flash"),
        ("cpu/msr", "device.cpu"),
        ("pts", "device.terminal"),
        ("ttyS", "device.terminal"),
        ("/dev/vc/0", "device.terminal"),
    ],
)
def test_a_node_whose_major_the_kernel_gives_a_floored_driver_is_refused(
    tmp_path: Path, driver: str, rule: str
) -> None:
    """watchdog0, bsg and tpmrm get their major at boot: /proc/devices says whose it is. Here a
    /proc/devices claiming major 1 for ``driver`` makes /dev/null (c 1:3) that device."""
    text = f"Character devices:\n  1 {driver}\n  4 tty\n\nBlock devices:\n  7 loop\n"
    said = f"'/dev/null' is a character device 1:3, which {floor_says(rule)}"
    assert refusal(claiming(tmp_path, text), node("/dev/null")).rule == said
    # The seam reaches a policy that notes grants for a suggestion (compat) too.
    watched = claiming(tmp_path, text).watched(Suggestion())
    assert refusal(watched, node("/dev/null")).rule == said
    claiming(tmp_path, text, unsafe={rule: True}).check(node("/dev/null"))


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("Character devices:\n  1 mem\n", id="the-real-owner"),
        pytest.param("Character devices:\n  2 watchdog\n", id="another-major"),
        pytest.param("Character devices:\n\nBlock devices:\n  1 watchdog\n", id="a-block-major"),
        pytest.param("", id="empty"),
        pytest.param("Character devices:\n  x watchdog\n  1\n", id="garbage"),
    ],
)
def test_a_node_whose_major_no_floored_driver_holds_passes(tmp_path: Path, text: str) -> None:
    claiming(tmp_path, text).check(node("/dev/null"))


def test_proc_devices_is_read_as_the_kernel_writes_it(tmp_path: Path) -> None:
    (tmp_path / "devices").write_text(
        "Character devices:\n  1 mem\n  4 /dev/vc/0\n  4 tty\n249 watchdog\n202 cpu/msr\n\n"
        "Block devices:\n  7 loop\n259 blkext\n"
    )
    assert read_proc_devices(str(tmp_path / "devices")) == {
        "c 1": frozenset({"mem"}),
        "c 4": frozenset({"/dev/vc/0", "tty"}),
        "c 249": frozenset({"watchdog"}),
        "c 202": frozenset({"cpu/msr"}),
        "b 7": frozenset({"loop"}),
        "b 259": frozenset({"blkext"}),
    }
    assert read_proc_devices(str(tmp_path / "absent")) == {}
    if os.path.exists(PROC_DEVICES):
        assert "mem" in read_proc_devices()["c 1"]


# --- mounts and container paths -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("host_path", "rule"),
    [
        pytest.param("/", "mount.root", id="root"),
        pytest.param("/proc", "mount.kernel", id="proc"),
        pytest.param("/proc/self/root", "mount.kernel", id="proc-pid-root"),
        pytest.param("/sys", "mount.kernel", id="sys"),
        pytest.param("/sys/kernel/security", "mount.kernel", id="sys-below"),
        pytest.param("/dev", "mount.kernel", id="dev"),
        pytest.param("/dev/shm", "mount.kernel", id="dev-shm"),
        pytest.param("/var/run/secrets/kubernetes.io/serviceaccount", "mount.secrets", id="sa-token"),
        pytest.param("/run/secrets", "mount.secrets", id="run-secrets"),
        pytest.param("/var/lib/kubelet", "mount.secrets", id="kubelet"),
        pytest.param("/var/lib/kubelet/pods", "mount.secrets", id="kubelet-pods"),
        pytest.param("/etc/kubernetes/admin.conf", "mount.secrets", id="kubeconfig"),
        pytest.param("/root", "mount.secrets", id="root-home"),
        pytest.param("/root/.ssh", "mount.secrets", id="root-ssh"),
        pytest.param("/etc/shadow", "mount.secrets", id="shadow"),
        pytest.param("/etc/ssh", "mount.secrets", id="ssh-keys"),
        pytest.param("/run/containerd/containerd.sock", "mount.runtime", id="containerd-sock"),
        pytest.param("/run/containerd", "mount.runtime", id="containerd-state"),
        pytest.param("/var/run/crio", "mount.runtime", id="crio"),
        pytest.param("/var/run/docker.sock", "mount.runtime", id="docker-sock"),
        pytest.param("/var/lib/docker", "mount.runtime", id="docker-state"),
        # A directory above what a rule guards holds it: /etc holds /etc/shadow, /run containerd's socket.
        pytest.param("/etc", "mount.secrets", id="etc-holds-shadow"),
        pytest.param("/var", "mount.secrets", id="var-holds-kubelet"),
        pytest.param("/var/lib", "mount.secrets", id="var-lib-holds-kubelet"),
        pytest.param("/run", "mount.secrets", id="run-holds-secrets"),
        pytest.param("/var/run", "mount.secrets", id="var-run-holds-secrets"),
    ],
)
def test_mount_attacks_are_refused_under_a_glob_of_everything(host_path: str, rule: str) -> None:
    refused = refusal(broad(), mount(host_path))
    assert (refused.field, refused.kind) == ("mounts[0].host_path", "mounts.host_path")
    assert refused.rule.endswith(floor_says(rule))
    broad(unsafe=dict.fromkeys((r.name for r in MOUNT_RULES), True)).check(mount(host_path))


def test_a_mount_rule_lifted_lifts_that_rule_alone() -> None:
    broad(unsafe={"mount.kernel": True}).check(mount("/proc"))
    # /run holds both the runtime's sockets and secrets: each rule holds on its own.
    refused = refusal(broad(unsafe={"mount.secrets": True}), mount("/run"))
    assert refused.rule == floor_says("mount.runtime")
    broad(unsafe={"mount.secrets": True, "mount.runtime": True}).check(mount("/run"))


def test_every_directory_above_what_a_mount_rule_guards_is_refused() -> None:
    """A mount holds everything below it: the floor's paths and every directory above them."""
    check = broad()
    for rule in MOUNT_RULES:
        for pattern in rule.patterns:
            path = literal_head(pattern)
            while True:
                assert check.floor.mount_rule(path) is not None, (rule.name, path)
                if path == "/":
                    break
                path = path.rpartition("/")[0] or "/"


@pytest.mark.parametrize(
    "host_path", ["/opt/vendor", "/var/lib/vendor", "/etc/vendor", "/run/vendor", "/usr/share/x"]
)
def test_mounts_beside_what_the_floor_guards_pass(host_path: str) -> None:
    broad().check(mount(host_path))


def test_a_link_to_what_a_mount_rule_guards_is_refused(tmp_path: Path) -> None:
    (tmp_path / "vendor").symlink_to("/var/lib")
    refused = refusal(broad(allow_world_writable_dirs=True), mount(str(tmp_path / "vendor")))
    assert refused.rule == f"it resolves to '/var/lib', which {floor_says('mount.secrets')}"


@pytest.mark.parametrize(
    "container_path",
    ["/etc/ld.so.preload", "/usr/lib/x", "/lib64", "/lib", "/lib32/x", "/libx32", "/bin/sh", "/sbin/init",
     "/boot/x", "/proc/sysrq-trigger", "/sys/x", "/etc", "/", "//", "/etc//passwd", "/usr/./lib"],
)  # fmt: skip
def test_container_paths_in_loader_and_system_locations_are_refused(container_path: str) -> None:
    """A mount at /etc/ld.so.preload is LD_PRELOAD by another name; /usr, /bin, /lib are the
    container's programs and libraries; /proc and /sys the kernel's."""
    check = broad(mounts=["/opt/**"])
    for grant, field in (
        (mount("/opt/x", container_path), "mounts[0].container_path"),
        (node("/dev/null", container_path), "device_nodes[0].container_path"),
    ):
        refused = refusal(check, grant)
        assert (refused.field, refused.rule) == (field, floor_says("container_path.system"))
    lifted = broad(mounts=["/opt/**"], unsafe={"container_path.system": True})
    lifted.check(mount("/opt/x", container_path))
    lifted.check(node("/dev/null", container_path))


@pytest.mark.parametrize("container_path", ["/opt/x", "/dev/x", "/usr2", "/etcetera/x", "/var/x", "/run/x"])
def test_other_container_paths_pass(container_path: str) -> None:
    broad().check(mount("/opt/x", container_path))


def test_writable_mounts_need_saying_so_under_any_glob() -> None:
    refused = refusal(broad(), mount("/opt/x", read_only=False))
    assert refused.rule == f"mounts must be read-only ({WHERE}.read_only_mounts)"
    broad(read_only_mounts=False).check(mount("/opt/x", read_only=False))


def test_the_floor_has_a_rule_for_each_name_and_every_device_rule_says_what_it_guards() -> None:
    assert set(RULES) == set(get_args(FloorRule))
    for rule in DEVICE_RULES:
        assert rule.patterns and rule.why, rule.name


def test_one_grant_may_break_several_rules_and_the_first_is_named() -> None:
    grant = ContainerGrant(
        envs={"SIM": "1", "LD_PRELOAD": "/x.so"},
        device_nodes=(DeviceNode("/dev/x", "/dev/kmsg"),),
        mounts=(Mount("/opt/x", "/proc", True),),
    )
    refused = refusal(broad(), grant)
    assert refused.field == "device_nodes[0].host_path"
    refused = refusal(broad(unsafe={"device.kmsg": True}), grant)
    assert refused.field == "mounts[0].host_path"
    refused = refusal(broad(unsafe={"device.kmsg": True, "mount.kernel": True}), grant)
    assert refused.field == "envs['LD_PRELOAD']"
