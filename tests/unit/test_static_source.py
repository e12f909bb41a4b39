"""The static source: devices and grants from settings."""

from __future__ import annotations

from shim.model import ContainerAllocateRequest, Device, DeviceNode, Health, Mount, PreferredAllocationRequest
from shim.settings import StaticSourceSettings
from shim.sources import StaticSource


def source(**settings: object) -> StaticSource:
    return StaticSource.from_settings(StaticSourceSettings.model_validate(settings))


async def test_count_names_devices_with_the_prefix() -> None:
    """count=N gives N healthy devices <prefix>0..N-1 without topology."""
    devices = await source(count=3, id_prefix="gpu").list_devices()
    assert devices == (Device("gpu0"), Device("gpu1"), Device("gpu2"))


async def test_explicit_devices_keep_numa_nodes_and_health() -> None:
    """An explicit list keeps NUMA nodes and starts unhealthy devices as Unhealthy."""
    devices = await source(
        devices=[{"id": "a", "numa_nodes": [1]}, {"id": "b", "healthy": False}]
    ).list_devices()
    assert devices == (Device("a", Health.HEALTHY, (1,)), Device("b", Health.UNHEALTHY, ()))


async def test_grant_templates_expand_per_allocation() -> None:
    """{ids} joins the allocated IDs; {id} repeats a device node or CDI name per device."""
    src = source(
        count=3,
        grant={
            "envs": {"FOO": "{ids}", "FIXED": "1"},
            "mounts": [{"container_path": "/opt", "host_path": "/host/opt", "read_only": True}],
            "device_nodes": [
                {"container_path": "/dev/foo{id}", "host_path": "/dev/foo{id}"},
                {"container_path": "/dev/ctl", "host_path": "/dev/ctl", "permissions": "r"},
            ],
            "cdi_devices": ["example.com/foo={id}"],
        },
    )
    (grant,) = await src.allocate([ContainerAllocateRequest(("dev0", "dev2"))])
    assert dict(grant.envs) == {"FOO": "dev0,dev2", "FIXED": "1"}
    assert grant.mounts == (Mount("/opt", "/host/opt", True),)
    assert grant.device_nodes == (
        DeviceNode("/dev/foodev0", "/dev/foodev0", "rw"),
        DeviceNode("/dev/foodev2", "/dev/foodev2", "rw"),
        DeviceNode("/dev/ctl", "/dev/ctl", "r"),
    )
    assert grant.cdi_devices == ("example.com/foo=dev0", "example.com/foo=dev2")


async def test_preferred_allocation_keeps_to_the_numa_node_of_must_include() -> None:
    """Devices on the must-include devices' NUMA node are preferred over earlier ones elsewhere."""
    src = source(
        devices=[
            {"id": "a", "numa_nodes": [0]},
            {"id": "b", "numa_nodes": [0]},
            {"id": "c", "numa_nodes": [1]},
            {"id": "d", "numa_nodes": [1]},
        ]
    )
    chosen = await src.preferred_allocation(PreferredAllocationRequest(("a", "b", "c", "d"), ("c",), 2))
    assert chosen == ["c", "d"]


async def test_a_change_is_fed_as_a_full_new_list() -> None:
    """feed() hands the sink the list at once, then the whole list again after set_health."""
    src = source(count=2)
    fed: list[tuple[Device, ...]] = []

    async def sink(devices: tuple[Device, ...]) -> None:
        fed.append(devices)

    await src.feed(sink)
    await src.set_health("dev1", Health.UNHEALTHY)
    assert fed == [(Device("dev0"), Device("dev1")), (Device("dev0"), Device("dev1", Health.UNHEALTHY))]
