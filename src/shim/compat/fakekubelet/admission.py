"""Which devices the kubelet gives a container: manager.go devicesToAllocate, as pure functions.

PluginSession.allocate_devices asks these with what it knows (the latest device list, the devices
in use, the plugin's preference) and does the calls around them.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from .errors import AdmissionRejected
from .records import DeviceState


def available_devices(
    resource: str, latest: Sequence[DeviceState], in_use: Collection[str], count: int
) -> list[str]:
    """The Healthy devices not in use, at least `count` of them, or AdmissionRejected."""
    # devicesToAllocate, in its order of checks and with its messages. Devices keep the plugin's
    # list order (upstream uses unordered sets) so tests are deterministic.
    healthy = [device.id for device in latest if device.healthy]
    if not healthy:
        raise AdmissionRejected(f"no healthy devices present; cannot allocate unhealthy devices {resource}")
    available = [device for device in healthy if device not in in_use]
    if len(available) < count:
        raise AdmissionRejected(
            f"requested number of devices unavailable for {resource}. "
            f"Requested: {count}, Available: {len(available)}"
        )
    return available


def take_preferred(available: Sequence[str], preferred: Sequence[str], needed: int) -> list[str]:
    """`needed` devices: the preferred ones that really are available, then the rest in order."""
    candidates = set(available)
    chosen = [device for device in dict.fromkeys(preferred) if device in candidates][:needed]
    return chosen + [device for device in available if device not in chosen][: needed - len(chosen)]
