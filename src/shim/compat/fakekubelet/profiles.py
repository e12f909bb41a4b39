"""Kubelet behaviour profiles: how kubelet releases differ while all speak v1beta1.

The device plugin API kept its version while the kubelet's handling of it changed, and those
changes are what broke real plugins. Each profile names the facts the fake kubelet acts on, with
the upstream source they come from (kubernetes/kubernetes, pkg/kubelet/cm/devicemanager/);
docs/compat.md gives the detail and says which release boundaries are uncertain.
"""

from __future__ import annotations

from dataclasses import dataclass

from .dirs import CleanupMode

# manager.go GetWatcherHandler created this empty file before 1.25, at every kubelet start after
# the directory cleanup; nothing reads it (kubernetes PR #58755 added it as a marker). Later
# releases keep the code (plugin/v1beta1/handler.go GetPluginHandler) but never call it: the
# upstream judge finds no DEPRECATION after any start of 1.30-1.37 (docs/compat.md).
DEPRECATION_FILE = "DEPRECATION"


@dataclass(frozen=True)
class Profile:
    name: str
    since: int
    """The first 1.N release that behaves so (0: every release before the next profile's)."""
    register_dials: bool
    """Register dials the plugin and calls GetDevicePluginOptions before it returns (1.25+:
    server.go Register -> handler.go connectClient). Otherwise (<= 1.24, manager.go Register ->
    `go m.addEndpoint(r)`) Register returns OK at once, the dial happens in the background, a
    failed dial is only logged, and the options come from RegisterRequest.options."""
    cleanup: CleanupMode
    """What a starting kubelet removes from device-plugins/ (dirs.py)."""
    deprecation_file: bool
    """A starting kubelet creates device-plugins/DEPRECATION after the cleanup."""
    old_stream_end_disconnects_by_name: bool
    """When a client's ListAndWatch ends, handler.go runClient looks the client up by resource
    name and disconnects whatever is registered under it now, which after a re-registration is
    the new one (kubernetes #121994; a 1.25 regression, fixed by PR #135437)."""
    source: str


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            "1.24",
            since=0,
            register_dials=False,
            cleanup=CleanupMode.KUBELET_1_25,
            deprecation_file=True,
            old_stream_end_disconnects_by_name=False,
            source="manager.go Register/addEndpoint/runEndpoint before PR #109016 (merged for 1.25)",
        ),
        Profile(
            "1.25-1.32",
            since=25,
            register_dials=True,
            cleanup=CleanupMode.KUBELET_1_25,
            deprecation_file=False,
            old_stream_end_disconnects_by_name=True,
            source="plugin/v1beta1/{server,handler,client}.go after PR #109016; removeContents cleanup "
            "(1.31.0 alone removed only sockets: PR #123819, reverted by #126976/#127100)",
        ),
        Profile(
            "1.33+",
            since=33,
            register_dials=True,
            cleanup=CleanupMode.KUBELET_1_33,
            deprecation_file=False,
            old_stream_end_disconnects_by_name=True,
            source="CleanupPluginDirectory removing only sockets (PR #130187, merged Feb 2025)",
        ),
        Profile(
            "next",
            since=37,
            register_dials=True,
            cleanup=CleanupMode.KUBELET_1_33,
            deprecation_file=False,
            old_stream_end_disconnects_by_name=False,
            source="PR #135437 (clients matched by name and socket path; merged May 2026, in "
            "1.37.2 as the upstream judge shows: manager.go PluginDisconnected takes the socket)",
        ),
    )
}


def profile_for_release(minor: int) -> Profile:
    """The profile that claims to behave as kubelet 1.`minor` (tests/compat/test_upstream_profiles.py
    holds each claim against the real release)."""
    return max((p for p in PROFILES.values() if p.since <= minor), key=lambda p: p.since)


def profile_named(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown kubelet profile {name!r}; known: {', '.join(PROFILES)}") from None
