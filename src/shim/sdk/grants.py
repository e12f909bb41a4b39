"""Grant templates for drivers, filled and merged exactly as devshim does (docs/driver-protocol.md).

    from shim.sdk.grants import GrantSettings, expand, merge

``GrantSettings`` is the template devshim's static resources are configured with (``{ids}`` in
env and annotation values becomes the comma-joined device IDs, ``{id}`` repeats a device node or a
CDI name per device); a driver that reads grants from its own configuration can take the same
model. ``expand(template, ids)`` fills it for some devices, and ``merge(grants)`` is the one grant
devshim makes of the declared grants of one container's devices. Both return a ``ContainerGrant``,
devshim's neutral grant; the driver turns it into the protocol's ``types.Grant``.
"""

from shim.grants import DeviceNodeSettings, GrantSettings, MountSettings, expand, merge
from shim.model import ContainerGrant

__all__ = [
    "ContainerGrant",
    "DeviceNodeSettings",
    "GrantSettings",
    "MountSettings",
    "expand",
    "merge",
]
