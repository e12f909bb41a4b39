"""What `devshim check-config` says beyond "valid": what each source may grant, and the likely
mistakes a file can load with.

Settings validation refuses what cannot run (docs/configuration.md); these are the things that
load but are probably not what was meant, so they are warnings (``--strict`` makes them errors):
a driver program this machine does not have, a file that serves nothing. And a file that is not
devshim's settings at all, but a driver's own configuration given by mistake, gets one line
saying so instead of a page of unknown fields. ``grants`` shows, resource by resource, what a
grant may hold (docs/configuration.md, "Grant policy"): the allowlists in force, and in capitals
any rule of the floor a policy lifts.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shim.configfile import ConfigError, read_config_file
from shim.driverhost.identity import IdentityError, identity
from shim.policy import RULES, GrantPolicy
from shim.settings import DriverSettings, Settings

# Keys of the built-in drivers' own configuration files (adapters/*/config.py), never devshim's.
_DRIVER_KEYS = {"control_file": "the simulator's", "groups": "devfs's", "poll_interval_s": "devfs's"}


def warnings(settings: Settings) -> list[str]:
    """What in loaded, valid ``settings`` is probably a mistake."""
    found = []
    if not settings.resources and not settings.drivers and settings.node_configs is None:
        found.append("it serves nothing: no resources and no drivers (docs/configuration.md)")
    for i, driver in enumerate(settings.drivers):
        program = driver.command[0]
        if not _runnable(program):
            found.append(
                f"drivers[{i}] ({driver.name}): {program!r} is not "
                + ("an executable file" if "/" in program else "on this machine's PATH")
                + " here (fine if the machine or image that runs devshim has it)"
            )
    found += _dra_warnings(settings)
    return found


def grants(settings: Settings) -> list[str]:
    """What each driver and static resource may grant, one block each: the resources it serves,
    and for each the policy in force and the setting it is read from."""
    lines = []
    for driver in settings.drivers:
        resources = driver.resources or []
        lines.append(f"driver {driver.name} may serve {', '.join(resources) or 'nothing'}")
        lines += _identity_lines(driver)
        for resource in resources:
            lines += _policy_lines(resource, driver.grant_policy(resource))
    if settings.resources:
        lines.append(f"the static config serves {', '.join(r.name for r in settings.resources)}")
    for static in settings.resources:
        shown = f"resources[{static.name}].static.grant (policy unset)" if static.policy is None else None
        lines += _policy_lines(static.name, static.grant_policy(), shown)
    return lines


def _identity_lines(driver: DriverSettings) -> list[str]:
    """Who the driver runs as on this node, as devshim would start it now."""
    try:
        found = identity(driver)
    except IdentityError as exc:
        return [f"  runs as: cannot tell ({exc})"]
    if found is None:
        who = "root, as its user setting says" if driver.user is not None else "devshim's user (not root)"
        return [f"  runs as {who}"]
    why = "unprivileged by default (drivers[].user changes it)" if found.default else "as its settings say"
    return [f"  runs as {found}: {why}"] + [f"  withheld: {line}" for line in found.withheld]


def _policy_lines(resource: str, policy: GrantPolicy, where: str | None = None) -> list[str]:
    """``resource``'s grants as ``policy`` allows them: each allowlist ("none": nothing of that
    kind), what qualifies them, then each floor rule lifted, in capitals."""
    settings = policy.settings
    types = settings.device_node_types
    kinds = "any type, or nothing at all" if types is None else " or ".join(types) + " devices"
    mounts = "read-only" if settings.read_only_mounts else "writable too"
    lines = [
        f"  {resource}: its grants may hold, as {where or policy.where} declares:",
        f"    envs: {_listed(settings.envs)}",
        f"    device_nodes: {_listed(settings.device_nodes)}"
        + (f" ({kinds})" if settings.device_nodes else ""),
        f"    mounts: {_listed(settings.mounts)}" + (f" ({mounts})" if settings.mounts else ""),
        f"    cdi_kinds: {_listed(settings.cdi_kinds)}",
        f"    annotation_key_prefixes: {_listed(settings.annotation_key_prefixes)}",
    ]
    if settings.allow_world_writable_dirs:
        lines.append("    host paths through world-writable directories: allowed (allow_world_writable_dirs)")
    for rule in sorted(rule for rule, on in settings.unsafe.items() if on):
        lines.append(
            f"    UNSAFE: the floor's rule {rule} is lifted ({policy.where}.unsafe): its grants may hold "
            f"{RULES[rule].why}"
        )
    return lines


# What check-config names the node when the settings leave it to the pod's NODE_NAME.
NODE_PLACEHOLDER = "node-from-the-pod"


def pod_node_placeholder(config: Path) -> str | None:
    """A node name to check ``config`` with where it has DRA drivers, names no dra.node_name and
    NODE_NAME is not set here (outside the pod whose downward API sets it); else None."""
    if os.environ.get("NODE_NAME"):
        return None
    try:
        data = read_config_file(config)
    except ConfigError:
        return None
    dra, chooser = data.get("dra"), data.get("node_configs")
    if isinstance(dra, dict) and dra.get("drivers") and not dra.get("node_name"):
        return NODE_PLACEHOLDER
    if isinstance(chooser, dict) and not chooser.get("node_name"):
        return NODE_PLACEHOLDER
    return None


def node_configs(settings: Settings, load: Callable[[Path], Settings]) -> tuple[list[str], list[str]]:
    """The summary's lines on the named configs a node label chooses among, and the problems of
    each that does not load (``load`` reads one as devshim would)."""
    chooser = settings.node_configs
    if chooser is None:
        return [], []
    folder = chooser.folder
    lines = [f"node configs: the node's label {chooser.label} chooses a file in {folder} (none: this file)"]
    if not folder.is_dir():
        return lines + [f"  {folder} is not a directory here (fine if the pod mounts it)"], []
    problems = []
    for path in sorted(folder.glob("*.yaml")):
        try:
            named = load(path)
        except ConfigError as exc:
            problems.append(f"node config {path.stem}: {exc}")
            continue
        if named.node_configs is not None:
            problems.append(
                f"node config {path.stem}: {path} sets node_configs, which only the default config may"
            )
            continue
        served = [r.name for r in named.resources] + [f"driver {d.name}" for d in named.drivers]
        lines.append(f"  {chooser.label}={path.stem}: serves {', '.join(served) or 'nothing'}")
    return lines, problems


def dra(settings: Settings, *, node_from_pod: bool) -> list[str]:
    """The summary's DRA lines: each driver's pool, and where the node's name comes from."""
    if not settings.dra.drivers:
        return []
    node = (
        "the pod's NODE_NAME (not set here: checked as if it were)"
        if node_from_pod
        else settings.dra.node_name
    )
    credentials = settings.dra.kubeconfig or "the pod's service account, else $KUBECONFIG"
    lines = [f"DRA on node {node}; the API server through {credentials}"]
    for pool in settings.dra.drivers:
        apis = "DRA only" if not pool.device_plugin else "DRA and the device plugin"
        extra = "; binding conditions answered" if pool.binding_conditions else ""
        lines.append(f"  DRA driver {pool.name}: {', '.join(pool.resources)}, served through {apis}{extra}")
    return lines


def _listed(values: list[str]) -> str:
    return ", ".join(values) or "none"


def _dra_warnings(settings: Settings) -> list[str]:
    """A DRA pool naming a resource nothing is set to serve: no static resource, and no driver
    lists it in its resources (the only ones a driver may serve)."""
    static = {r.name for r in settings.resources}
    listed = {name for d in settings.drivers for name in d.resources or ()}
    found = []
    for i, pool in enumerate(settings.dra.drivers):
        for name in pool.resources:
            if name not in static and name not in listed:
                found.append(
                    f"dra.drivers[{i}] ({pool.name}): {name} is not a static resource, and no driver "
                    "may: each lists its resources, and none lists it; its pool stays empty without it"
                )
    return found


def _runnable(program: str) -> bool:
    if "/" in program:
        return os.access(program, os.X_OK) and Path(program).is_file()
    return shutil.which(program) is not None  # devshim looks bare names up on its own PATH


def foreign(data: dict[str, Any]) -> str | None:
    """Why ``data`` (a settings file that did not load) looks like a driver's own configuration,
    if it does: its keys, or resources with devices but no ``static``."""
    for key, whose in _DRIVER_KEYS.items():
        if key in data:
            return f"it has {key!r}, a key of {whose} own configuration"
    resources = data.get("resources")
    if (
        isinstance(resources, list)
        and resources
        and all(isinstance(r, dict) for r in resources)
        and not any("static" in r for r in resources)
        and any({"devices", "count"} & set(r) for r in resources)
    ):
        return "its resources list devices without 'static', as a driver's own configuration does"
    return None
