"""What `devshim check-config` says beyond "valid": the likely mistakes a file can load with.

Settings validation refuses what cannot run (docs/configuration.md); these are the things that
load but are probably not what was meant, so they are warnings (``--strict`` makes them errors):
a driver program this machine does not have, a file that serves nothing. And a file that is not
devshim's settings at all, but a driver's own configuration given by mistake, gets one line
saying so instead of a page of unknown fields.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from shim.settings import Settings

# Keys of the built-in drivers' own configuration files (adapters/*/config.py), never devshim's.
_DRIVER_KEYS = {"control_file": "the simulator's", "groups": "devfs's", "poll_interval_s": "devfs's"}


def warnings(settings: Settings) -> list[str]:
    """What in loaded, valid ``settings`` is probably a mistake."""
    found = []
    if not settings.resources and not settings.drivers:
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


def _dra_warnings(settings: Settings) -> list[str]:
    """A DRA pool naming a resource nothing is set to serve: a driver that declares resources
    without a `resources` list may still serve it, so it is a warning; a static resource, never."""
    static = {r.name for r in settings.resources}
    listed = {name for d in settings.drivers for name in d.resources or ()}
    open_drivers = any(d.resources is None for d in settings.drivers)
    found = []
    for i, pool in enumerate(settings.dra.drivers):
        for name in pool.resources:
            if name not in static and name not in listed:
                maybe = (
                    "unless a driver declares it (no driver lists it in its resources)"
                    if open_drivers
                    else ("and no driver may: each lists its resources, and none lists it")
                )
                found.append(
                    f"dra.drivers[{i}] ({pool.name}): {name} is not a static resource, {maybe}; "
                    "its pool stays empty without it"
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
