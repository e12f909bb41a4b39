"""A driver without the SDK serving several resources, one of which may grow past a bound (raw JSON).

Its switches come from the environment (devshim passes exactly the configured ``env``):

RUN_FILE
    Required. Every run appends ``start <pid>`` to it, so a run knows its number and the test
    can count the restarts and signal the running one.
RESOURCES
    Required. ``NAME=COUNT,...``: the resources it declares, each with COUNT Healthy devices
    named ``<name>-<n>`` (``a-0`` for ``example.com/a``).
GROW
    ``NAME=COUNT``: in its first run, on SIGUSR1, send ``devices_changed`` listing COUNT devices
    for NAME, the last of them with the health ``BOGUS``, which the protocol's reader refuses:
    a list refused for that device was read, one refused by its length was not.
GROW_LISTED
    ``NAME=COUNT``: in its first run, answer ``list_devices`` for NAME with COUNT devices.

Allocate answers an empty grant per container. Later runs behave.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

from usr1 import on_sigusr1

_write = threading.Lock()


def send(message: dict[str, Any]) -> None:
    """One JSON-RPC message on stdout, whole: straight to the file descriptor, never interleaved."""
    with _write:
        view = memoryview(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")
        while view:
            view = view[os.write(1, view) :]


def pairs(value: str) -> dict[str, int]:
    return {name: int(count) for name, _, count in (p.partition("=") for p in value.split(",") if p)}


def devices(resource: str, count: int, last_health: str = "HEALTHY") -> list[dict[str, str]]:
    short = resource.rpartition("/")[2]
    listed = [{"id": f"{short}-{n}", "health": "HEALTHY"} for n in range(count)]
    if listed:
        listed[-1]["health"] = last_health
    return listed


def grow(resource: str, count: int) -> None:
    sys.stderr.write(f"many_resources: listing {count} devices for {resource} on purpose\n")
    sys.stderr.flush()
    params = {"resource": resource, "devices": devices(resource, count, "BOGUS")}
    send({"method": "devices_changed", "params": params})


def main() -> None:
    env = os.environ
    run_file = Path(env["RUN_FILE"])
    with run_file.open("a") as runs:
        runs.write(f"start {os.getpid()}\n")
    first = sum(line.startswith("start ") for line in run_file.read_text().splitlines()) == 1
    resources = pairs(env["RESOURCES"])
    listed = {**resources, **(pairs(env.get("GROW_LISTED", "")) if first else {})}
    if first and env.get("GROW"):
        ((name, count),) = pairs(env["GROW"]).items()

        on_sigusr1(lambda: grow(name, count))

    for line in sys.stdin.buffer:
        request = json.loads(line)
        if "id" not in request:
            continue
        method, params = request.get("method"), request.get("params") or {}
        result: Any
        if method == "initialize":
            declared = [{"name": name} for name in resources]
            result = {
                "protocol_version": "1.0.0",
                "driver": {"name": "many_resources"},
                "resources": declared,
            }
        elif method == "list_devices":
            result = {"devices": devices(params["resource"], listed[params["resource"]])}
        elif method == "allocate":
            result = {"containers": [{} for _ in params["containers"]]}
        elif method == "shutdown":
            send({"id": request["id"], "result": {}})
            return
        else:
            send({"id": request["id"], "error": {"code": -32601, "message": "method not found"}})
            continue
        send({"id": request["id"], "result": result})


if __name__ == "__main__":
    main()
