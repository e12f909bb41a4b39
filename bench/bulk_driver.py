"""A driver holding many devices over several resources, for the ``bound`` row (raw JSON lines).

Usage (run by devshim): python -m bench.bulk_driver --control FILE --resource NAME=COUNT ...
[--interval S]. Each resource lists no device until the control file exists; then the driver
sends ``devices_changed`` with COUNT NVIDIA-like devices (``GPU-<uuid-like>``, 40 characters)
for every resource, and while the file says ``resend`` it re-sends one resource's list every
``--interval`` seconds (default 1), round robin, its first device's health flipped each time, so
devshim builds, publishes, encodes and saves a list at the bound again and again. Allocate
answers an empty grant.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

_write = threading.Lock()
ID = b"GPU-00000000-0000-4000-8%03d-%012d"  # the resource's number, then the device's


def write_line(data: bytes) -> None:
    with _write:
        view = memoryview(data + b"\n")
        while view:
            view = view[os.write(1, view) :]


def device_list(seed: int, count: int, first_health: bytes) -> bytes:
    """The JSON array of ``count`` devices, built as bytes (50,000 take 50 ms, not half a second)."""
    record = b'{"id":"%s","health":"HEALTHY","numa_nodes":[%d]}'
    first = b'{"id":"%s","health":"%s","numa_nodes":[0]}' % (ID % (seed, 0), first_health)
    rest = [record % (ID % (seed, n), n % 4) for n in range(1, count)]
    return b"[" + b",".join([first, *rest][:count]) + b"]"


class Bulk:
    def __init__(self, resources: dict[str, int], control: Path, interval_s: float) -> None:
        self.resources = resources
        self.control = control
        self.interval_s = interval_s
        self.full = False
        # Each resource's two lists (first device Healthy, Unhealthy), built once it is needed.
        self._lists: dict[str, tuple[bytes, bytes]] = {}

    def lists(self, resource: str) -> tuple[bytes, bytes]:
        if resource not in self._lists:
            seed, count = list(self.resources).index(resource), self.resources[resource]
            self._lists[resource] = (
                device_list(seed, count, b"HEALTHY"),
                device_list(seed, count, b"UNHEALTHY"),
            )
        return self._lists[resource]

    def changed(self, resource: str, flipped: bool) -> bytes:
        head = b'{"jsonrpc":"2.0","method":"devices_changed","params":{"resource":%s,"devices":'
        return head % json.dumps(resource).encode() + self.lists(resource)[flipped] + b"}}"

    def run(self) -> None:
        while not self.control.exists():
            time.sleep(0.05)
        self.full = True
        for resource in self.resources:
            write_line(self.changed(resource, False))
        for n in itertools.count(1):
            while self.control.read_text().strip() != "resend":
                time.sleep(0.05)
            time.sleep(self.interval_s)
            resource = list(self.resources)[n % len(self.resources)]
            write_line(self.changed(resource, bool(n // len(self.resources) % 2)))

    def answer(self, method: str, params: dict[str, Any]) -> Any:
        if method == "initialize":
            declared = [{"name": name} for name in self.resources]
            return {"protocol_version": "1.0.0", "driver": {"name": "bulk"}, "resources": declared}
        if method == "list_devices":
            return {"devices": json.loads(self.lists(params["resource"])[0]) if self.full else []}
        if method == "allocate":
            return {"containers": [{} for _ in params["containers"]]}
        if method == "shutdown":
            return {}
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--control", type=Path, required=True)
    parser.add_argument("--resource", action="append", default=[], help="NAME=COUNT")
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args()
    resources = {name: int(count) for name, _, count in (r.partition("=") for r in args.resource)}
    bulk = Bulk(resources, args.control, args.interval)
    threading.Thread(target=bulk.run, daemon=True).start()
    for line in sys.stdin.buffer:
        request = json.loads(line)
        if "id" not in request:
            continue
        result = bulk.answer(request.get("method", ""), request.get("params") or {})
        if result is None:
            reply = {"id": request["id"], "error": {"code": -32601, "message": "method not found"}}
        else:
            reply = {"id": request["id"], "result": result}
        write_line(json.dumps({"jsonrpc": "2.0", **reply}).encode())
        if request.get("method") == "shutdown":
            return


if __name__ == "__main__":
    main()
