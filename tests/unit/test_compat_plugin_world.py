"""Which socket `devshim compat --plugin` dials for a plugin of several resources (issue 42,
item 5): the socket of the resource its checks read the kubelet's session of, not whichever
Register arrived first (another resource's, or one the kubelet refused), which sent one
resource's device IDs to another resource's server and failed a good plugin."""

from __future__ import annotations

import asyncio
from pathlib import Path

from shim.compat.fakekubelet.records import RegistrationRecord
from shim.compat.plugin_world import Arrival, PluginUnderTest, PluginWorld, ProbingKubelet


def record(resource: str, endpoint: str, error: str | None) -> RegistrationRecord:
    return RegistrationRecord(resource, endpoint, "v1beta1", None, 0.0, error)


def test_the_checks_dial_the_socket_of_the_resource_whose_session_they_read(tmp_path: Path) -> None:
    kubelet = ProbingKubelet(tmp_path, profile="1.33+")
    world = PluginWorld(PluginUnderTest(command="plugin"), "1.33+", kubelet)
    # The plugin's second resource registered first, and was refused; then its first one.
    kubelet.arrivals += [
        Arrival("example.com/b", tmp_path / "b.sock", 1.0, None),
        Arrival("example.com/a", tmp_path / "a.sock", 2.0, None),
    ]
    kubelet.registrations += [
        record("example.com/b", "b.sock", "refused"),
        record("example.com/a", "a.sock", None),
    ]
    assert asyncio.run(world.resource()) == "example.com/a"
    assert asyncio.run(world.socket()) == tmp_path / "a.sock"


def test_before_any_register_succeeds_the_first_one_names_the_socket(tmp_path: Path) -> None:
    kubelet = ProbingKubelet(tmp_path, profile="1.33+")
    world = PluginWorld(PluginUnderTest(command="plugin"), "1.33+", kubelet)
    kubelet.arrivals.append(Arrival("example.com/b", tmp_path / "b.sock", 1.0, "refused the connection"))
    assert asyncio.run(world.socket()) == tmp_path / "b.sock"
