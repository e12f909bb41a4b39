"""The columns of the driver matrix: which kubelet devshim faces, and how devshim registers.

A mode is a kubelet behaviour profile (shim.compat.fakekubelet.profiles: how a kubelet release behaves
within one API version), the API versions that kubelet speaks, and the registration path.
v1beta2 exists in no kubelet release, so only the `next` profile speaks it; every profile speaks
v1beta1. KUBELET_LINE is the upgrade order an upgrade cell climbs one step of (a downgrade cell
steps back down it).
"""

from __future__ import annotations

from dataclasses import dataclass

PROFILES = ("1.24", "1.25-1.32", "1.33+", "next")
VERSION_SETS: dict[str, tuple[str, ...]] = {
    "v1beta1": ("v1beta1",),
    "both": ("v1beta1", "v1beta2"),
    "v1beta2": ("v1beta2",),
}
REGISTRATIONS = ("classic", "watcher")


@dataclass(frozen=True, order=True)
class Kubelet:
    """One kubelet: a behaviour profile speaking a set of API versions."""

    profile: str
    speaks: str  # a key of VERSION_SETS

    @property
    def versions(self) -> tuple[str, ...]:
        return VERSION_SETS[self.speaks]

    @property
    def negotiated(self) -> str:
        """What devshim (offering both) ends up speaking: the newest version the kubelet has."""
        return "v1beta2" if "v1beta2" in self.versions else "v1beta1"


KUBELET_LINE = (
    *(Kubelet(profile, "v1beta1") for profile in PROFILES),
    Kubelet("next", "both"),
    Kubelet("next", "v1beta2"),
)


@dataclass(frozen=True)
class Mode:
    kubelet: Kubelet
    registration: str

    @property
    def id(self) -> str:
        return f"{self.kubelet.profile}/{self.kubelet.speaks}/{self.registration}"

    @property
    def newer(self) -> Kubelet | None:
        """The next kubelet up the upgrade line, if any."""
        i = KUBELET_LINE.index(self.kubelet)
        return KUBELET_LINE[i + 1] if i + 1 < len(KUBELET_LINE) else None


MODES = tuple(Mode(kubelet, registration) for kubelet in KUBELET_LINE for registration in REGISTRATIONS)


def mode(mode_id: str) -> Mode:
    for m in MODES:
        if m.id == mode_id:
            return m
    raise ValueError(f"unknown mode {mode_id!r}; known: {', '.join(m.id for m in MODES)}")


def in_default_subset(m: Mode, scenario_index: int) -> bool:
    """The project's own CI runs every v1beta1 cell, and pairwise coverage of the rest: each
    scenario once with `both` and once with `v1beta2`, alternating the registration path, so every
    (kubelet, path) pair and every (scenario, kubelet) pair is covered."""
    if m.kubelet.speaks == "v1beta1":
        return True
    i = scenario_index
    paired = {("both", REGISTRATIONS[i % 2]), ("v1beta2", REGISTRATIONS[(i + 1) % 2])}
    return (m.kubelet.speaks, m.registration) in paired
