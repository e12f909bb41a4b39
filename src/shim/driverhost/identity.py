"""Who a driver runs as: unprivileged, unless its settings say otherwise.

devshim runs as root; a driver is vendor code that needs none of root's powers to list devices
and answer Allocate. So a driver whose settings name no ``user`` runs, under a root devshim, as
nobody (uid and gid 65534) with one supplementary group per device node its grant policy
declares, so it can open the devices it grants and nothing else of root's. ``user: root`` keeps
devshim's ids (a legacy plugin behind the legacy adapter needs them). A devshim that is not root
has nothing to drop: its drivers run as it does.

A device node's group is given only where it gives no more than the policy allows, since
membership opens every node of the group: never group 0 (root's), nor a group that also owns a
node under /dev that the policy does not allow or the floor guards (disk owns the host's disks,
tty its terminals, video may own a framebuffer beside the GPUs).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from shim.policy import Floor
from shim.policy.paths import Globs, Looks
from shim.settings import DriverSettings, account, group_id, user_id

# nobody and nogroup on Debian, Red Hat and Alpine alike, and the overflow id of every kernel.
DEFAULT_UID = DEFAULT_GID = 65534
DEVICES_DIR = "/dev"
# /dev is small (hundreds of nodes); a walk stops here rather than follow a runaway tree.
MAX_DEVICE_ENTRIES = 20_000
MAX_DEVICE_DEPTH = 8


class IdentityError(ValueError):
    """The ids a driver's settings name cannot be resolved on this node now."""


@dataclass(frozen=True)
class Identity:
    """The ids a driver's launcher switches to. ``uid`` None: devshim's own uid is kept."""

    uid: int | None
    gid: int
    groups: tuple[int, ...]
    default: bool  # devshim's unprivileged default, not a user the settings name
    withheld: tuple[str, ...] = ()  # device groups not given, each with why

    def launcher_argument(self) -> str:
        """ "uid:gid:group,group", as the launcher (process.LAUNCHER) reads it."""
        uid = "" if self.uid is None else str(self.uid)
        return f"{uid}:{self.gid}:{','.join(str(g) for g in self.groups)}"

    def __str__(self) -> str:
        uid = os.getuid() if self.uid is None else self.uid
        return f"uid {uid}, gid {self.gid}, groups {','.join(str(g) for g in self.groups)}"


def identity(settings: DriverSettings, devices_dir: str = DEVICES_DIR) -> Identity | None:
    """Who ``settings``' driver runs as, resolved now (a change in the user or group database
    counts from its next start); None: as devshim itself."""
    try:
        uid = None if settings.user is None else user_id(settings.user)
        gid = None if settings.group is None else group_id(settings.group)
    except ValueError as exc:
        raise IdentityError(str(exc)) from None
    default = uid is None and os.geteuid() == 0
    if default:
        uid = DEFAULT_UID
    elif uid == 0 or uid is None:
        if gid is None:
            return None  # root as configured, or a devshim that is not root: nothing to switch
        uid = None  # a group alone: devshim's uid is kept
    entry = account(uid) if uid is not None else None
    if gid is None:
        if default:
            gid = DEFAULT_GID
        elif entry is None:
            raise IdentityError(f"user {settings.user} is no longer in the user database")
        else:
            gid = entry.pw_gid
    # Supplementary groups as a login gets them: the user's own, from the group database (device
    # access is often granted to a group, such as video or dialout), never devshim's; then those
    # of the device nodes the driver may grant.
    groups = set(os.getgrouplist(entry.pw_name, gid) if entry is not None else [gid])
    given, withheld = device_groups(settings, devices_dir)
    return Identity(uid, gid, tuple(sorted(groups | given)), default, withheld)


def device_groups(
    settings: DriverSettings, devices_dir: str = DEVICES_DIR
) -> tuple[set[int], tuple[str, ...]]:
    """The groups of the device nodes the driver's policies cover, less each that would give
    more than they do (see the module's docstring); and why each withheld one is."""
    policies = [
        (Globs(p.device_nodes), p.device_node_types)
        for p in (settings.policy, *settings.resource_policies.values())
        if p.device_nodes
    ]
    if not policies:
        return set(), ()
    floor, looks = Floor(()), Looks()

    def covered(path: str, found: os.stat_result) -> bool:
        kind = "char" if stat.S_ISCHR(found.st_mode) else "block"
        return any(g.cover(path) and (t is None or kind in t) for g, t in policies) and not (
            floor.device_path_rule(path) or floor.node_rule(found, looks)
        )

    wanted: dict[int, str] = {}  # gid -> a covered node of it
    foreign: dict[int, str] = {}  # gid -> a node of it that is not covered
    tops = {devices_dir} | {head for globs, _ in policies for head in globs.heads}
    for path, found in _device_nodes(sorted(tops)):
        (wanted if covered(path, found) else foreign).setdefault(found.st_gid, path)
    given = {gid for gid in wanted if gid != 0 and gid not in foreign}
    withheld = tuple(
        f"group {gid} of {path}: "
        + ("root's group" if gid == 0 else f"it also owns {foreign[gid]}, which the policy does not allow")
        for gid, path in sorted(wanted.items())
        if gid not in given
    )
    return given, withheld


def _device_nodes(tops: list[str]) -> Iterator[tuple[str, os.stat_result]]:
    """Each character or block device node below ``tops`` (links not followed), once, bounded."""
    seen = 0
    pending = [(top, 0) for top in tops]
    visited: set[tuple[int, int]] = set()
    while pending:
        directory, depth = pending.pop()
        try:
            found = os.stat(directory)
            if (found.st_dev, found.st_ino) in visited:
                continue  # a head below /dev, walked already or to come
            visited.add((found.st_dev, found.st_ino))
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            if seen > MAX_DEVICE_ENTRIES:
                return
            try:
                found = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(found.st_mode) and depth < MAX_DEVICE_DEPTH:
                pending.append((entry.path, depth + 1))
            elif stat.S_ISCHR(found.st_mode) or stat.S_ISBLK(found.st_mode):
                yield entry.path, found
