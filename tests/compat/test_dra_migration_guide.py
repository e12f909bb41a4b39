"""docs/dra.md, "From the device plugin to DRA": every devshim config the guide shows loads, and
every object it shows is created as written on a real API server (the newest release's, where
`extendedResourceName` is GA); the stages themselves run in test_dra_coexistence.py and
test_real_node_dra.py."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from shim.compat.realnode import ControlPlane
from shim.compat.realnode.apiserver import APIError
from shim.settings import Settings
from tests.support import ROOT, control_plane

GUIDE = ROOT / "docs" / "dra.md"
BLOCK = re.compile(r"<!-- migration: (?P<name>[^>]+) -->\n```yaml\n(?P<body>.*?)```", re.S)


def blocks() -> dict[str, Any]:
    found = {m["name"]: yaml.safe_load(m["body"]) for m in BLOCK.finditer(GUIDE.read_text())}
    assert len(found) == 5, sorted(found)
    return found


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    with control_plane.running(control_plane.DEFAULT[0], "ds-guide-cp-") as running:
        yield running


@pytest.mark.parametrize("stage", ["stage 2, devshim", "stage 3, devshim"])
def test_each_stages_devshim_config_loads(stage: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "node-1")  # the downward API's, as the DaemonSet gives it
    settings = Settings.load(**blocks()[stage])
    [driver] = settings.dra.drivers
    assert (driver.name, driver.resources) == ("gpu.example.com", ["example.com/gpu"])
    assert driver.device_plugin is (stage == "stage 2, devshim")


def contains(stored: Any, written: Any) -> bool:
    """Everything written is in what was stored (the server may add defaults, not drop fields)."""
    if isinstance(written, dict):
        return isinstance(stored, dict) and all(
            k in stored and contains(stored[k], v) for k, v in written.items()
        )
    if isinstance(written, list):
        return (
            isinstance(stored, list) and len(stored) == len(written) and all(map(contains, stored, written))
        )
    return bool(stored == written)


def test_each_object_is_created_as_written(plane: ControlPlane) -> None:
    """In the guide's order; the stage 3 DeviceClass replaces stage 2's of the same name, as an
    operator's `kubectl apply` would."""
    objects = [body for name, body in blocks().items() if not name.endswith("devshim")]
    assert [o["kind"] for o in objects] == ["DeviceClass", "ResourceClaimTemplate", "DeviceClass"]
    for obj in objects:
        plural = {"DeviceClass": "deviceclasses", "ResourceClaimTemplate": "resourceclaimtemplates"}[
            obj["kind"]
        ]
        where = "" if obj["kind"] == "DeviceClass" else "namespaces/default/"
        path = f"/apis/{obj['apiVersion']}/{where}{plural}"
        try:
            plane.request("DELETE", f"{path}/{obj['metadata']['name']}")
        except APIError as err:
            assert err.status == 404, err
        created = plane.request("POST", path, obj)
        # A field the server does not know, or whose feature is off, would be dropped.
        assert contains(created["spec"], obj["spec"]), (obj["spec"], created["spec"])
