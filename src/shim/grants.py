"""Grants: the configured template, expanding it for some devices, and merging declared grants.

The template is read from devshim's settings (a static source's grant) and from drivers'
configurations (through shim.sdk.grants), so a template expands alike on both sides.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Annotated

from pydantic import Field

from shim.configfile import StrictModel
from shim.model import ContainerGrant, DeviceNode, Mount


class MountSettings(StrictModel):
    container_path: str
    host_path: str
    read_only: bool = False


class DeviceNodeSettings(StrictModel):
    """``{id}`` in either path expands to one node per allocated device."""

    container_path: str
    host_path: str
    permissions: Annotated[str, Field(pattern=r"^[rwm]{1,3}$")] = "rw"


class GrantSettings(StrictModel):
    """A grant as configured: a static source's, or a driver's (the simulator's).

    In env and annotation values ``{ids}`` becomes the comma-joined allocated IDs;
    in device-node paths and CDI names ``{id}`` repeats the entry per device.
    """

    envs: dict[str, str] = {}
    mounts: list[MountSettings] = []
    device_nodes: list[DeviceNodeSettings] = []
    annotations: dict[str, str] = {}
    cdi_devices: list[str] = []


def expand(template: GrantSettings, ids: Sequence[str]) -> ContainerGrant:
    """``{ids}`` in env and annotation values becomes the comma-joined IDs;
    ``{id}`` in a device node's paths or a CDI name repeats that entry per device."""
    joined = ",".join(ids)

    def per_device(text: str) -> Sequence[str]:
        return ids if "{id}" in text else ("",)

    return ContainerGrant(
        envs={k: v.replace("{ids}", joined) for k, v in template.envs.items()},
        mounts=tuple(Mount(m.container_path, m.host_path, m.read_only) for m in template.mounts),
        device_nodes=tuple(
            DeviceNode(n.container_path.replace("{id}", i), n.host_path.replace("{id}", i), n.permissions)
            for n in template.device_nodes
            for i in per_device(n.host_path + n.container_path)
        ),
        annotations={k: v.replace("{ids}", joined) for k, v in template.annotations.items()},
        cdi_devices=tuple(name.replace("{id}", i) for name in template.cdi_devices for i in per_device(name)),
    )


def merge(grants: Iterable[ContainerGrant]) -> ContainerGrant:
    """One container's grant from its devices' declared grants (docs/driver-protocol.md):
    values of one env or annotation key are joined with "," in order, repeats dropped;
    mounts, device nodes and CDI names are concatenated in order, repeats dropped."""
    envs: dict[str, list[str]] = {}
    annotations: dict[str, list[str]] = {}
    mounts: dict[Mount, None] = {}
    nodes: dict[DeviceNode, None] = {}
    cdi: dict[str, None] = {}
    for grant in grants:
        for target, source in ((envs, grant.envs), (annotations, grant.annotations)):
            for key, value in source.items():
                values = target.setdefault(key, [])
                if value not in values:
                    values.append(value)
        mounts.update(dict.fromkeys(grant.mounts))
        nodes.update(dict.fromkeys(grant.device_nodes))
        cdi.update(dict.fromkeys(grant.cdi_devices))
    return ContainerGrant(
        envs={k: ",".join(v) for k, v in envs.items()},
        mounts=tuple(mounts),
        device_nodes=tuple(nodes),
        annotations={k: ",".join(v) for k, v in annotations.items()},
        cdi_devices=tuple(cdi),
    )


class ByDevices:
    """Grants built once per device-ID tuple, so the same devices get the same grant object, whose
    policy verdict and encoding are kept by identity (shim/incremental.py PerObject).

    Keyed by the IDs' value; what it hands out is shared, which is safe as grants are frozen.
    ``build`` must depend on nothing but the IDs while this cache lives: a source whose grants
    change (a driver's new declared grants) makes a new ByDevices rather than clearing this one.
    At most LIMIT tuples are kept; past that it starts afresh."""

    LIMIT = 4096  # tuples kept: bounded, whatever the kubelet asks for

    def __init__(self, build: Callable[[tuple[str, ...]], ContainerGrant]) -> None:
        self._build = build
        self._built: dict[tuple[str, ...], ContainerGrant] = {}

    def get(self, device_ids: tuple[str, ...]) -> ContainerGrant:
        grant = self._built.get(device_ids)
        if grant is None:
            if len(self._built) >= self.LIMIT:
                self._built.clear()
            grant = self._built[device_ids] = self._build(device_ids)
        return grant


class Equal:
    """One object per distinct grant: a driver that answers the same devices with an equal grant
    on every call gets the first object back, whose policy verdict and encoding are kept by
    identity (shim/incremental.py PerObject).

    Keyed by value (ContainerGrant's hash and equality, mappings in any order), so the object
    returned may be an earlier, equal one, not the one passed in: its envs may be in another
    order. At most LIMIT grants are kept; past that it starts afresh."""

    LIMIT = 1024  # grants kept: bounded, whatever a driver answers

    def __init__(self) -> None:
        self._seen: dict[ContainerGrant, ContainerGrant] = {}

    def __call__(self, grant: ContainerGrant) -> ContainerGrant:
        seen = self._seen.get(grant)
        if seen is None:
            if len(self._seen) >= self.LIMIT:
                self._seen.clear()
            seen = self._seen[grant] = grant
        return seen
