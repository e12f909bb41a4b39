"""The device-plugin API versions the fake kubelet can speak, and how it picks one.

A FakeKubelet speaks a chosen subset (`versions=`). On the classic path each spoken version has
its own Registration service on kubelet.sock; on the plugin watcher path the kubelet picks the
newest version it shares with the plugin, as upstream's server.go isVersionCompatibleWithPlugin
says it should once there are several ("say kubelet supports v1beta1 and v1beta2, and we get
v1alpha1 and v1beta1 from a device plugin, this function should return v1beta1").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from . import v1beta1, v1beta2
from .wire import Wire

# Oldest first: a version's position is its age.
WIRES: dict[str, Wire] = {wire.version: wire for wire in (v1beta1.WIRE, v1beta2.WIRE)}
API_VERSIONS: tuple[str, ...] = tuple(WIRES)


def newest_first(versions: Iterable[str]) -> tuple[str, ...]:
    """The given versions, checked, without repeats, newest first; ValueError if none or unknown."""
    chosen = set(versions)
    unknown = sorted(chosen - set(WIRES))
    if unknown:
        raise ValueError(f"unknown device plugin API versions {unknown}; known: {list(API_VERSIONS)}")
    if not chosen:
        raise ValueError("a kubelet must speak at least one device plugin API version")
    return tuple(version for version in reversed(API_VERSIONS) if version in chosen)


def newest_common(spoken: Sequence[str], offered: Sequence[str]) -> str | None:
    """The newest of the kubelet's `spoken` versions (newest first) that the plugin offers."""
    return next((version for version in spoken if version in offered), None)
