"""The compatibility matrix: kubelet versions x registration path x scenario.

Every v1beta1 cell runs by default, plus a pairwise subset of the rest (each
scenario with each other kubelet and each path, every kubelet x path pair);
`pytest --full-matrix` runs all cells. A cell that cannot apply is skipped
with its reason; no v1beta1 cell is ever skipped.
"""

from __future__ import annotations

from typing import NamedTuple

import pytest

V1 = ("v1beta1",)
BOTH = ("v1beta1", "v1beta2")
V2 = ("v1beta2",)
KUBELETS = {"v1beta1": V1, "both": BOTH, "v1beta2": V2}
REGISTRATIONS = ("classic", "watcher")
SCENARIOS = (
    "register",
    "list_watch",
    "health_change",
    "allocate",
    "preferred_allocation",
    "prestart",
    "deallocate",
    "post_stop",
    "kubelet_restart",
    "upgrade",
    "downgrade",
)
# Kubelet version sets in upgrade order: an upgrade cell restarts from its set to the next
# one, a downgrade cell from the next one down to its set.
ORDER = ("v1beta1", "both", "v1beta2")


class Cell(NamedTuple):
    kubelet: str
    registration: str
    scenario: str

    @property
    def id(self) -> str:
        return f"{self.kubelet}-{self.registration}-{self.scenario}"

    def in_default_run(self) -> bool:
        if self.kubelet == "v1beta1":
            return True
        i = SCENARIOS.index(self.scenario)
        paired = {("both", REGISTRATIONS[i % 2]), ("v1beta2", REGISTRATIONS[(i + 1) % 2])}
        return (self.kubelet, self.registration) in paired

    def skip_reason(self) -> str | None:
        if self.scenario in ("upgrade", "downgrade") and self.kubelet == ORDER[-1]:
            return "v1beta2 is the newest version: there is nothing to upgrade to or downgrade from"
        return None


def cells() -> list[Cell]:
    return [Cell(k, r, s) for k in KUBELETS for r in REGISTRATIONS for s in SCENARIOS]


def params() -> list[object]:
    return [pytest.param(cell, id=cell.id, marks=[] if cell.in_default_run() else [pytest.mark.full_matrix])
            for cell in cells()]  # fmt: skip


def negotiated(versions: tuple[str, ...]) -> str:
    """devshim offers both; the newest version the kubelet speaks wins either way."""
    return "v1beta2" if "v1beta2" in versions else "v1beta1"
