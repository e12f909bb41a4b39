"""A hostile driver, raw JSON lines: it declares whatever resource names it is told to, other
sources' resources and invalid names included, and serves each with devices of its own.

Its switches come from the environment (devshim passes exactly the configured ``env``):

CLAIM_RESOURCES
    A JSON list of the resource names ``initialize`` declares (default: none).
CLAIM_STEPS
    A JSON list of such lists. Each SIGUSR1 sends the next one as ``resources_changed`` (the test
    signals once it has seen the previous step's effect, so each message arrives at a known moment).
CLAIM_PREFIX
    Device IDs are ``<prefix>0`` and ``<prefix>1`` for every resource (default ``claim-``), so the
    kubelet's list shows whose devices a resource has; allocate grants ``{"CLAIMED": "<ids>"}``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Any

from usr1 import on_sigusr1

_write = threading.Lock()


def send(message: dict[str, Any]) -> None:
    """One line on stdout, whole, straight to the file descriptor, one writer at a time (the
    SIGUSR1 thread writes too)."""
    with _write:
        view = memoryview(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")
        while view:
            view = view[os.write(1, view) :]


def main() -> None:
    env = os.environ
    declared: list[str] = json.loads(env.get("CLAIM_RESOURCES", "[]"))
    steps: list[list[str]] = json.loads(env.get("CLAIM_STEPS", "[]"))
    prefix = env.get("CLAIM_PREFIX", "claim-")
    devices = [{"id": f"{prefix}{n}", "health": "HEALTHY"} for n in range(2)]

    def next_step() -> None:
        names = steps.pop(0)
        sys.stderr.write(f"claiming: resources_changed {names!r}\n")
        send({"method": "resources_changed", "params": {"resources": [{"name": n} for n in names]}})

    on_sigusr1(next_step)
    for line in sys.stdin.buffer:
        request = json.loads(line)
        if "id" not in request:
            continue
        method, params = request.get("method"), request.get("params") or {}
        result: dict[str, Any]
        if method == "initialize":
            resources = [{"name": n} for n in declared]
            result = {"protocol_version": "1.0.0", "driver": {"name": "claiming"}, "resources": resources}
        elif method == "list_devices":
            result = {"devices": devices}
        elif method == "allocate":
            result = {
                "containers": [{"envs": {"CLAIMED": ",".join(c["device_ids"])}} for c in params["containers"]]
            }
        elif method == "shutdown":
            send({"id": request["id"], "result": {}})
            return
        else:
            send({"id": request["id"], "error": {"code": -32601, "message": "method not found"}})
            continue
        send({"id": request["id"], "result": result})


if __name__ == "__main__":
    main()
