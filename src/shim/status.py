"""What a running devshim is doing: collected for /status, fetched and rendered for `devshim status`."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from shim.model import Device, Health

if TYPE_CHECKING:
    from shim.deviceplugin.endpoint import PluginEndpoint
    from shim.driverhost import DriverHost


def resource_status(
    endpoint: PluginEndpoint | None, devices: Sequence[Device], held: dict[str, list[str]] | None = None
) -> dict[str, Any]:
    """One served resource: its kubelet endpoint (None: served through DRA only), the devices its
    core service lists and, in a DRA pool, which API holds which device (core/holds.py)."""
    counts = {
        "Healthy": sum(d.health is Health.HEALTHY for d in devices),
        "Unhealthy": sum(d.health is not Health.HEALTHY for d in devices),
    }
    if endpoint is None:
        return {"registered": None, "dra_only": True, "devices": counts}
    return {
        "registered": endpoint.registered,
        "negotiated": endpoint.negotiated or None,
        "registrations": endpoint.registrations,
        "socket": str(endpoint.socket_path),
        **({"watcher": endpoint.watcher_status} if endpoint.watcher_mode else {}),
        "devices": counts,
        "last_error": endpoint.last_error or None,
        "waiting": endpoint.waiting or None,
        **({"held": held} if held is not None else {}),
    }


def driver_status(driver: DriverHost) -> dict[str, Any]:
    process = driver.process
    return {
        "status": driver.status,
        # Only a running process's: a driver that is down has none.
        "pid": process.pid if process is not None and process.returncode is None else None,
        "resources": sorted(driver.sources),
        "failures": driver.failures + driver.start_failures,  # failed runs and failed starts
        "last_failure": driver.last_failure or None,
        # The resources it offered last that it may not serve, each with why (the first few).
        "refused": dict(driver.refused),
        "calls": {
            m: {"ok": t.ok, "failed": t.failed, "last_error": t.last_error or None}
            for m, t in sorted(driver.calls.items())
        },  # fmt: skip
    }


# Above the ops server's 5 s wait for a busy serving loop: a devshim that is slow to compute
# /status answers (500, saying so) before this client gives up.
FETCH_TIMEOUT_S = 10.0
# What every devshim's /status document holds (bootstrap.Shim.status).
_STATUS_KEYS = frozenset({"version", "registration", "resources", "drivers", "deallocation"})


class StatusUnavailable(Exception):
    """No devshim status at the address; the message says what answered instead, if anything."""


def fetch_status(host: str, port: int, timeout_s: float = FETCH_TIMEOUT_S) -> dict[str, Any]:
    """The /status document of the devshim whose ops endpoint is at ``host:port``."""
    url = f"http://{host}:{port}/status"
    nobody = f"no devshim answers at {url}"
    other = (
        f"{nobody}: port {port} is served by something other than devshim ({{}}). A devshim that "
        "finds its port taken logs 'ops endpoint: cannot listen on ...' and serves without it: give it "
        "another http.port"
    )
    try:
        code, body = _get(url, timeout_s)
    except ConnectionRefusedError:
        raise StatusUnavailable(
            f"{nobody}: nothing listens there; is devshim running, with http enabled?"
        ) from None
    except (http.client.HTTPException, ConnectionError) as exc:  # closed unanswered, or not HTTP
        raise StatusUnavailable(other.format(f"no HTTP answer: {exc!r}")) from None
    except OSError as exc:  # timed out, an unknown host, ...
        raise StatusUnavailable(f"{nobody} ({exc})") from None
    if code not in (200, 404):  # devshim's refusals say why (403: asked from another host)
        said = body.decode(errors="replace").strip().splitlines() or [""]
        raise StatusUnavailable(f"{url} answered HTTP {code}: {said[0]}")
    try:
        report = json.loads(body) if code == 200 else None
    except ValueError:
        report = None
    if not isinstance(report, dict) or not report.keys() >= _STATUS_KEYS:
        what = (
            "HTTP 404 for /status, which every devshim serves"
            if code == 404
            else f"it answered {body[:60]!r}"
        )
        raise StatusUnavailable(other.format(what))
    return report


# The ops endpoint is local: never asked through a proxy the environment names.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _get(url: str, timeout_s: float) -> tuple[int, bytes]:
    """The status and body of a GET, an error status too; OSError or HTTPException without an answer."""
    try:
        with _OPENER.open(url, timeout=timeout_s) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, OSError):
            raise exc.reason from None
        raise


def render_status(report: dict[str, Any]) -> str:
    lines = [
        f"devshim {report.get('version', '?')}: {report.get('ready', '')}",
        f"registration {report.get('registration')}, API {', '.join(report.get('api_versions', []))}; "
        f"deallocation emulation: {report.get('deallocation')}",
    ]
    for name, resource in report.get("resources", {}).items():
        devices = resource.get("devices", {})
        state = f"registered as {resource.get('negotiated') or 'chosen by the kubelet'}"
        if resource.get("dra_only"):
            state = "served through DRA only"
        elif not resource.get("registered"):
            why = resource.get("watcher") or resource.get("waiting")
            state = "NOT registered" + (f" ({why})" if why else "")
        healthy, unhealthy = devices.get("Healthy", 0), devices.get("Unhealthy", 0)
        counts = f"{healthy} Healthy, {unhealthy} Unhealthy" if healthy or unhealthy else "no devices"
        count = resource.get("registrations", 0)
        registrations = (
            "" if resource.get("dra_only") else f", {count} registration{'' if count == 1 else 's'}"
        )
        lines.append(f"  {name}: {state}{registrations}; {counts}")
        if resource.get("last_error"):
            lines.append(f"    last error: {resource['last_error']}")
        held = resource.get("held") or {}
        if held.get("dra") or held.get("device_plugin"):
            lines.append(
                f"    held through DRA: {', '.join(held.get('dra', [])) or 'none'}; "
                f"through the device plugin: {', '.join(held.get('device_plugin', [])) or 'none'}"
            )
    for name, driver in report.get("drivers", {}).items():
        lines += _driver_lines(name, driver)
    dra = report.get("dra")
    for name, pool in (dra if isinstance(dra, dict) else {}).items():
        where = f"resource.k8s.io/{pool.get('version')}" if pool.get("version") else "no version found yet"
        lines.append(
            f"  DRA {name}: pool {pool.get('node')} generation {pool.get('generation')}, "
            f"{pool.get('devices')} devices in {pool.get('slices')} slices ({where}), "
            f"{pool.get('writes')} writes"
        )
        if pool.get("last_error"):
            lines.append(f"    last error: {pool['last_error']}")
        lines += _dra_kubelet_lines(pool.get("kubelet"))
    return "\n".join(lines)


def _dra_kubelet_lines(kubelet: Any) -> list[str]:
    if not isinstance(kubelet, dict):
        return []
    registered = {True: "registered", False: "REFUSED", None: "not registered yet"}[kubelet.get("registered")]
    calls = ", ".join(f"{n} {what}" for what, n in sorted((kubelet.get("calls") or {}).items())) or "no calls"
    lines = [
        f"    kubelet: {registered}, calls {kubelet.get('service') or 'nothing yet'} "
        f"(health: {kubelet.get('health_service') or 'none'}); {kubelet.get('prepared_claims', 0)} claims "
        f"prepared; {calls}"
    ]
    for key in ("registration_error", "last_error"):
        if kubelet.get(key):
            lines.append(f"    {key.replace('_', ' ')}: {kubelet[key]}")
    return lines


def _driver_lines(name: str, driver: dict[str, Any]) -> list[str]:
    # The state's reason, if any, is the last failure's, shown on a line of its own.
    state = str(driver.get("status", "")).partition(":")[0]
    pid = f" (pid {driver['pid']})" if driver.get("pid") else ""
    serving = ", ".join(driver.get("resources", [])) or "nothing"
    lines = [f"  driver {name}: {state}{pid}, {driver.get('failures', 0)} failures, serving {serving}"]
    if driver.get("last_failure"):
        lines.append(f"    last failure: {driver['last_failure']}")
    for resource, why in sorted((driver.get("refused") or {}).items()):
        lines.append(f"    refused {resource}: {why}")
    for method, calls in driver.get("calls", {}).items():
        if calls.get("failed"):
            lines.append(f"    {method}: {calls['failed']} failed calls, last: {calls.get('last_error')}")
    return lines
