"""One simulated resource: its devices, its grants, its preference rule."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from shim.sdk import UnknownDevice, types
from shim.sdk.config import binding_from_json
from shim.sdk.grants import ContainerGrant, expand, merge

from .config import DeviceConfig, ResourceConfig


@dataclass(slots=True)
class SimDevice:
    id: str
    numa_nodes: tuple[int, ...]
    health: types.Health
    attributes: dict[str, types.Attribute] = field(default_factory=dict)
    capacity: dict[str, str] = field(default_factory=dict)
    taints: list[types.DeviceTaint] = field(default_factory=list)
    counter_sets: list[types.CounterSet] = field(default_factory=list)
    consumes_counters: list[types.CounterConsumption] = field(default_factory=list)
    allow_multiple_allocations: bool = False
    capacity_policies: dict[str, types.CapacityPolicy] = field(default_factory=dict)
    binding: types.DeviceBinding | None = None


def _policy(policy: dict[str, Any]) -> types.CapacityPolicy:
    ranged = policy.get("valid_range")
    return types.CapacityPolicy(
        default=policy["default"],
        valid_values=list(policy.get("valid_values") or []),
        valid_range=types.CapacityRange(**ranged) if ranged else None,
    )


def _binding(config: DeviceConfig) -> types.DeviceBinding | None:
    if config.binding is None:
        return None
    checked = binding_from_json(config.binding)
    assert checked is not None
    return types.DeviceBinding(
        conditions=list(checked.conditions),
        failure_conditions=list(checked.failure_conditions),
        binds_to_node=checked.binds_to_node,
    )


def _sim_device(config: DeviceConfig) -> SimDevice:
    return SimDevice(
        config.id,
        tuple(config.numa_nodes),
        types.Health.HEALTHY if config.healthy else types.Health.UNHEALTHY,
        {name: types.Attribute(**value) for name, value in config.attributes.items()},  # type: ignore[arg-type]
        dict(config.capacity),
        [types.DeviceTaint(**taint) for taint in config.taints],
        [types.CounterSet(name=c["name"], counters=dict(c["counters"])) for c in config.counter_sets],
        [
            types.CounterConsumption(counter_set=c["counter_set"], counters=dict(c["counters"]))
            for c in config.consumes_counters
        ],
        config.allow_multiple_allocations,
        {name: _policy(p) for name, p in config.capacity_policies.items()},
        _binding(config),
    )


def grant_message(grant: ContainerGrant) -> types.Grant:
    return types.Grant(
        envs=dict(grant.envs),
        mounts=[
            types.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in grant.mounts
        ],
        device_nodes=[
            types.DeviceNode(
                container_path=n.container_path, host_path=n.host_path, permissions=n.permissions
            )
            for n in grant.device_nodes
        ],
        annotations=dict(grant.annotations),
        cdi_devices=list(grant.cdi_devices),
    )


class SimResource:
    def __init__(self, config: ResourceConfig) -> None:
        self.config = config
        self.name = config.name
        self.devices: dict[str, SimDevice] = {d.id: _sim_device(d) for d in config.initial_devices()}
        # A device's declared grant depends on its ID alone: build its message once, as
        # building 50,000 of them for every list would take about a second.
        self._declared: dict[str, types.Grant] = {}
        # Likewise a container's grant depends on its IDs alone; the SDK asks resources() on every
        # request, so the resource's message is built once too.
        self._granted: dict[tuple[str, ...], types.Grant] = {}
        self._message = types.Resource(
            name=config.name,
            preferred_allocation=config.preferred_allocation,
            prestart=config.prestart,
            deallocate=config.deallocate,
            post_stop=config.post_stop,
            admin_access=config.admin_access,
            shares=config.shares,
            attach=config.attach,
        )

    def message(self) -> types.Resource:
        return self._message

    def device_messages(self) -> list[types.Device]:
        declared = self.config.grant_mode == "declared"
        return [
            types.Device(
                id=d.id,
                health=d.health,
                numa_nodes=list(d.numa_nodes),
                grant=self._declared_grant(d.id) if declared else None,
                attributes=d.attributes,
                capacity=d.capacity,
                taints=d.taints,
                counter_sets=d.counter_sets,
                consumes_counters=d.consumes_counters,
                allow_multiple_allocations=d.allow_multiple_allocations,
                capacity_policies=d.capacity_policies,
                binding=d.binding,
            )
            for d in self.devices.values()
        ]

    def _declared_grant(self, device_id: str) -> types.Grant:
        grant = self._declared.get(device_id)
        if grant is None:
            grant = self._declared[device_id] = grant_message(expand(self.config.grant, [device_id]))
        return grant

    def cdi_spec(self) -> types.CdiSpec | None:
        """The CDI spec this resource ships, if configured: one device per device ID."""
        spec = self.config.cdi_spec
        if spec is None:
            return None
        devices = []
        for device_id in self.devices:
            edits = expand(spec.edits, [device_id])
            written = grant_message(edits)
            devices.append(
                types.CdiSpecDevice(
                    name=device_id,
                    edits=types.CdiEdits(
                        envs=written.envs, mounts=written.mounts, device_nodes=written.device_nodes
                    ),
                )
            )
        return types.CdiSpec(kind=spec.kind, devices=devices)

    def check(self, ids: Iterable[str]) -> None:
        for device_id in ids:
            if device_id not in self.devices:
                raise UnknownDevice(self.name, device_id)

    def grant(self, ids: list[str]) -> types.Grant:
        """What one container gets: in declared mode the merge devshim would compute itself."""
        self.check(ids)
        key = tuple(ids)
        grant = self._granted.get(key)
        if grant is None:
            if len(self._granted) >= 4096:  # bounded, whatever devshim asks for
                self._granted.clear()
            if self.config.grant_mode == "declared":
                built = merge(expand(self.config.grant, [i]) for i in ids)
            else:
                built = expand(self.config.grant, ids)
            grant = self._granted[key] = grant_message(built)
        return grant

    def prefer(self, request: types.PreferenceRequest) -> list[str]:
        """must_include first, then available devices sharing a NUMA node with them, then
        the rest, each in the order given; ``size`` of them."""
        self.check([*request.must_include, *request.available])
        chosen = list(dict.fromkeys(request.must_include))
        nodes = {n for i in chosen for n in self.devices[i].numa_nodes}
        taken = set(chosen)
        near: list[str] = []
        far: list[str] = []
        for i in dict.fromkeys(request.available):
            if i not in taken:
                (far if nodes.isdisjoint(self.devices[i].numa_nodes) else near).append(i)
        return (chosen + near + far)[: request.size]

    def resize(self, count: int) -> None:
        """Keep the first ``count`` devices; new ones are named ``<prefix><n>`` with the lowest free n."""
        for device_id in list(self.devices)[count:]:
            del self.devices[device_id]
        n = 0
        while len(self.devices) < count:
            device_id = f"{self.config.prefix}{n}"
            if device_id not in self.devices:
                self.devices[device_id] = _sim_device(self.config.with_defaults(DeviceConfig(id=device_id)))
            n += 1

    def attached(self, device_id: str) -> list[types.BindingCondition]:
        """attach's answer for ``device_id``: every binding condition True, or (``attach_answer``
        failed) the first failure condition True."""
        self.check([device_id])
        binding = self.devices[device_id].binding
        if binding is None:
            return []
        if self.config.attach_answer == "failed":
            return [
                types.BindingCondition(
                    type=binding.failure_conditions[0], status=True, reason="AttachFailed",
                    message=f"{device_id} could not be attached (simulated)",
                )
            ]  # fmt: skip
        return [types.BindingCondition(type=c, status=True, reason="Attached") for c in binding.conditions]
