"""What a running devshim is doing: collected for /status, rendered for `devshim status`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from shim.model import Device, Health

if TYPE_CHECKING:
    from shim.driverhost import DriverHost
    from shim.frontend.endpoint import PluginEndpoint


def resource_status(endpoint: PluginEndpoint, devices: Sequence[Device]) -> dict[str, Any]:
    """One served resource: its kubelet endpoint, and the devices its core service lists."""
    return {
        "registered": endpoint.registered,
        "negotiated": endpoint.negotiated or None,
        "registrations": endpoint.registrations,
        "socket": str(endpoint.socket_path),
        **({"watcher": endpoint.watcher_status} if endpoint.watcher_mode else {}),
        "devices": {
            "Healthy": sum(d.health is Health.HEALTHY for d in devices),
            "Unhealthy": sum(d.health is not Health.HEALTHY for d in devices),
        },
        "last_error": endpoint.last_error or None,
    }


def driver_status(driver: DriverHost) -> dict[str, Any]:
    return {
        "status": driver.status,
        "pid": driver.process.pid if driver.process else None,
        "resources": sorted(driver.sources),
        "failures": driver.failures,
        "last_failure": driver.last_failure or None,
        "calls": {
            m: {"ok": t.ok, "failed": t.failed, "last_error": t.last_error or None}
            for m, t in sorted(driver.calls.items())
        },  # fmt: skip
    }


def render_status(report: dict[str, Any]) -> str:
    lines = [
        f"devshim {report.get('version', '?')}: {report.get('ready', '')}",
        f"registration {report.get('registration')}, API {', '.join(report.get('api_versions', []))}; "
        f"deallocation emulation: {report.get('deallocation')}",
    ]
    for name, resource in report.get("resources", {}).items():
        devices = resource.get("devices", {})
        state = f"registered as {resource.get('negotiated') or 'chosen by the kubelet'}"
        if not resource.get("registered"):
            state = "NOT registered" + (f" ({resource['watcher']})" if resource.get("watcher") else "")
        lines.append(
            f"  {name}: {state}, {resource.get('registrations', 0)} registrations; "
            f"{devices.get('Healthy', 0)} Healthy, {devices.get('Unhealthy', 0)} Unhealthy"
        )
        if resource.get("last_error"):
            lines.append(f"    last error: {resource['last_error']}")
    for name, driver in report.get("drivers", {}).items():
        failed = {m: c for m, c in driver.get("calls", {}).items() if c.get("failed")}
        serving = ", ".join(driver.get("resources", [])) or "nothing"
        lines.append(
            f"  driver {name}: {driver.get('status')} (pid {driver.get('pid')}), "
            f"{driver.get('failures', 0)} failures, serving {serving}"
        )
        if driver.get("last_failure"):
            lines.append(f"    last failure: {driver['last_failure']}")
        for method, calls in failed.items():
            lines.append(f"    {method}: {calls['failed']} failed calls, last: {calls.get('last_error')}")
    return "\n".join(lines)
