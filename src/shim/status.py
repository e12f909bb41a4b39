"""`devshim status`: a running devshim's /status, rendered for a person."""

from __future__ import annotations

from typing import Any


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
