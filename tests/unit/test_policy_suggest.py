"""The suggested declaration: what `devshim compat` prints for an operator to paste.

Learnt the way compat learns it (a policy watching grants with its allowlists not held), the
suggestion loaded as GrantPolicySettings must accept the very grants it was learnt from; what
broke the floor is listed by rule and never put in an allowlist (lifting a rule is the
operator's call); and nothing a driver sends makes the suggestion a declaration that does not load.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from shim.compat.driver_world import ABOVE_THE_FLOOR
from shim.errors import GrantRefused
from shim.model import ContainerGrant, DeviceNode, Mount
from shim.policy import GrantPolicy, GrantPolicySettings, Suggestion
from tests.unit.test_policy import RESOURCE, WHERE, make_node, private_dir, refusal


@pytest.fixture
def private() -> Iterator[Path]:
    with private_dir() as made:
        yield made


def learnt(*grants: ContainerGrant) -> Suggestion:
    """What compat learns with no --config: every grant noted, above the floor, the
    allowlists not held."""
    suggestion = Suggestion()
    above_the_floor = GrantPolicySettings(**ABOVE_THE_FLOOR)
    learning = GrantPolicy(RESOURCE, above_the_floor, WHERE).watched(suggestion, declared=False)
    for grant in grants:
        with contextlib.suppress(GrantRefused):  # a refused grant is noted all the same
            learning.check(grant)
    return suggestion


def replayed(suggestion: Suggestion) -> GrantPolicy:
    return GrantPolicy(RESOURCE, GrantPolicySettings(**suggestion.policy()), WHERE)


def test_the_declaration_learnt_accepts_the_grants_it_was_learnt_from(private: Path) -> None:
    (private / "lib").mkdir()
    (private / "state").mkdir()
    (private / "gpu0").symlink_to("/dev/full")  # a by-path link: where it leads is declared too
    make_node(private / "disk", stat.S_IFBLK, 7, 0)
    grants = [
        ContainerGrant(
            envs={"SIM_DEVICES": "0", "NVIDIA_VISIBLE_DEVICES": "0"},
            device_nodes=(DeviceNode("/dev/sim0", "/dev/null"), DeviceNode("/dev/g", str(private / "gpu0"))),
            mounts=(Mount("/opt/lib", str(private / "lib"), True),),
            cdi_devices=("example.com/gpu=0",),
        ),
        ContainerGrant(
            device_nodes=(
                DeviceNode("/dev/z", "//dev/zero", "r"),
                DeviceNode("/dev/d", str(private / "disk")),
            ),
            mounts=(Mount("/var/state", str(private / "state"), False),),
            annotations={"example.com/owner": "sim", "cdi.k8s.io/sim": "vendor.io/nic=1, vendor.io/nic=2"},
        ),
    ]
    suggestion = learnt(*grants)
    assert (suggestion.refused, suggestion.floor) == (0, {})
    assert suggestion.policy() == {
        "envs": ["NVIDIA_VISIBLE_DEVICES", "SIM_DEVICES"],
        "device_nodes": sorted(
            ["/dev/full", "/dev/null", "/dev/zero", str(private / "gpu0"), str(private / "disk")]
        ),
        "mounts": [str(private / "lib"), str(private / "state")],
        "cdi_kinds": ["example.com/gpu", "vendor.io/nic"],
        "annotation_key_prefixes": ["cdi.k8s.io/sim", "example.com/owner"],
        "device_node_types": ["char", "block"],
        "read_only_mounts": False,
    }
    declared = replayed(suggestion)
    for grant in grants:
        declared.check(grant)
    # And no more than that: a neighbour of what was learnt is refused.
    assert "not declared" in refusal(declared, ContainerGrant(envs={"SIM_FPGAS": "0"})).rule
    assert "not declared" in refusal(declared, ContainerGrant(cdi_devices=("vendor.io/gpu=0",))).rule


def test_a_driver_that_grants_nothing_gets_an_empty_declaration() -> None:
    suggestion = learnt(ContainerGrant(), ContainerGrant())
    assert (suggestion.policy(), suggestion.floor) == ({}, {})
    assert GrantPolicySettings(**suggestion.policy()) == GrantPolicySettings()


def test_what_breaks_the_floor_is_listed_by_rule_and_never_suggested(private: Path, tmp_path: Path) -> None:
    """By name, by where a link leads, by a node's number, and container paths too; the
    grant is refused while learning, and the rest of it is still learnt."""
    (private / "lib").mkdir()
    (private / "innocent").symlink_to("/dev/kmsg")
    make_node(private / "tty", stat.S_IFCHR, 5, 0)
    (tmp_path / "vendor").symlink_to("/var/lib")
    grant = ContainerGrant(
        envs={"SIM_DEVICES": "0", "LD_PRELOAD": "/x.so", "SHELLOPTS": "xtrace", "PS4": "$(x)"},
        device_nodes=(
            DeviceNode("/dev/sim0", "/dev/null"),
            DeviceNode("/dev/k", "/dev/kmsg"),
            DeviceNode("/dev/i", str(private / "innocent")),
            DeviceNode("/dev/t", str(private / "tty")),
            DeviceNode("/dev/pts/0", "/dev/pts/0"),
        ),
        mounts=(
            Mount("/opt/lib", str(private / "lib"), True),
            Mount("/etc/ld.so.preload", str(private / "lib"), True),
            Mount("/host", "/etc", True),
            Mount("/host-proc", "/proc", True),
            Mount("/v", str(tmp_path / "vendor"), True),
        ),
    )
    suggestion = learnt(grant)
    assert suggestion.refused == 1
    assert suggestion.floor == {
        "env.loader": {"LD_PRELOAD"},
        "env.shell": {"SHELLOPTS", "PS4"},
        "device.kmsg": {"/dev/kmsg", str(private / "innocent")},
        "device.terminal": {str(private / "tty"), "/dev/pts/0"},
        "container_path.system": {"/etc/ld.so.preload"},
        "mount.secrets": {"/etc", str(tmp_path / "vendor")},
        "mount.kernel": {"/proc"},
    }
    assert suggestion.policy() == {
        "envs": ["SIM_DEVICES"],
        "device_nodes": ["/dev/null"],
        "mounts": [str(private / "lib")],
    }


def test_what_no_declaration_could_allow_is_left_out_and_the_declaration_loads() -> None:
    """Malformed names and relative paths are refused whatever is declared: suggesting them
    would only make the declaration fail to load."""
    grant = ContainerGrant(
        envs={"A B": "1", "1X": "1", "": "1", "OK_NAME": "1"},
        device_nodes=(DeviceNode("/dev/a", "dev/null"), DeviceNode("/dev/b", "/dev/null\x00x")),
        mounts=(Mount("/opt/x", "opt/x", True),),
        annotations={"": "1", "cdi.k8s.io/x": "not-a-cdi-name, a b/c=0,vendor.io/ok=0"},
        cdi_devices=("bad", "a.com/x=", "vendor.io/g pu=0", "*/x=0"),
    )
    suggestion = learnt(grant)
    assert suggestion.policy() == {
        "envs": ["OK_NAME"],
        "cdi_kinds": ["vendor.io/ok"],
        "annotation_key_prefixes": ["cdi.k8s.io/x"],
    }
    GrantPolicySettings(**suggestion.policy())


def test_a_link_devshim_may_not_read_is_not_suggested() -> None:
    try:
        os.readlink("/proc/1/root")
    except PermissionError:
        pass
    else:
        pytest.skip("this process may read /proc/1/root")
    suggestion = learnt(ContainerGrant(device_nodes=(DeviceNode("/dev/x", "/proc/1/root/dev/null"),)))
    assert (suggestion.refused, suggestion.policy()) == (1, {})


def test_a_path_through_a_world_writable_directory_is_learnt_and_said_in_the_declaration(
    tmp_path: Path,
) -> None:
    """Learning holds the floor only: a node reached through a directory anyone may write to is
    noted, and the declaration says allow_world_writable_dirs so that the operator sees it and
    replaying it passes; without that key the same grant is refused."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    (shared / "gpu0").symlink_to("/dev/null")
    grant = ContainerGrant(device_nodes=(DeviceNode("/dev/g", str(shared / "gpu0")),))
    suggestion = learnt(grant)
    declared = suggestion.policy()
    assert declared["allow_world_writable_dirs"] is True
    replayed(suggestion).check(grant)
    without = GrantPolicySettings(**{k: v for k, v in declared.items() if k != "allow_world_writable_dirs"})
    with pytest.raises(GrantRefused, match="which anyone may write to"):
        GrantPolicy(RESOURCE, without, WHERE).check(grant)


def test_learning_with_an_empty_policy_holds_the_floor_only_and_says_what_the_mount_needs(
    private: Path,
) -> None:
    """compat learning with an entry's empty policy: a writable mount passes (the settings'
    read_only_mounts is an allowlist's, not the floor's), and the declaration says
    read_only_mounts: false; a floor rule still refuses."""
    (private / "state").mkdir()
    grant = ContainerGrant(mounts=(Mount("/var/state", str(private / "state"), False),))
    suggestion = Suggestion()
    learning = GrantPolicy(RESOURCE, GrantPolicySettings(), WHERE).watched(suggestion, declared=False)
    learning.check(grant)
    assert suggestion.policy()["read_only_mounts"] is False
    replayed(suggestion).check(grant)
    with pytest.raises(GrantRefused, match="env.loader"):
        learning.check(ContainerGrant(envs={"LD_PRELOAD": "/x.so"}))
