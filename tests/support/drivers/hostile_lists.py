"""A driver without the SDK that sends device lists devshim must refuse (raw JSON lines).

Serves ``example.com/hostile`` with devices ``h-0``, ``h-1``, per-call allocate with the grant
``{"HOSTILE": "<ids>"}``, one request at a time. Its switches come from the environment
(devshim passes exactly the configured ``env``):

RUN_FILE
    Required. Every run appends ``start <pid>`` to it, so a run knows its number and the test
    can count the restarts and signal the running one.
HOSTILE_MODE
    What the first run does on SIGUSR1 (the test sends it once the kubelet has seen the
    devices, so the attack comes at a known moment); later runs behave:
    ``list`` sends ``devices_changed`` with HOSTILE_DEVICES devices (``h-0``, ``h-1`` and
    ``x<n>``, see big_list), Healthy, in one line;
    ``values`` sends ``devices_changed`` listing ``h-0`` and ``h-1``, ``h-1`` carrying a grant
    whose ``cdi_devices`` holds HOSTILE_VALUES one-letter strings: few devices, many values;
    ``listed`` (no signal) answers its first ``list_devices`` with HOSTILE_DEVICES devices;
    ``numa`` sends ``devices_changed`` with ``h-0`` on NUMA node 2**64-1 (sysfs's ``-1`` read
    as uint64), then ``health_changed`` marking ``h-1`` Unhealthy;
    ``flood`` (every run, no signal: the benchmark's) sends ``devices_changed`` every
    HOSTILE_INTERVAL_S seconds (default 1) from the moment ``list_devices`` was answered, with
    as many devices as the file HOSTILE_FLOOD_FILE says then (none while it is missing or 0),
    ``h-1`` flipping health each time so that no two lists are equal;
    ``none`` (the default) behaves.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from usr1 import on_sigusr1

RESOURCE = "example.com/hostile"
DEVICES = ["h-0", "h-1"]
_write = threading.Lock()


def write_line(data: bytes) -> None:
    """One line on stdout, whole: straight to the file descriptor, never interleaved."""
    with _write:
        view = memoryview(data + b"\n")
        while view:
            view = view[os.write(1, view) :]


def send(message: dict[str, Any]) -> None:
    write_line(json.dumps({"jsonrpc": "2.0", **message}).encode())


def log(text: str) -> None:
    sys.stderr.write(f"hostile_lists: {text}\n")
    sys.stderr.flush()


def big_list(count: int, h1_health: str = "HEALTHY") -> bytes:
    """devices_changed with ``count`` devices, built as bytes: 700,000 devices take 1 s, not 5.
    IDs are ``x<n>``, or HOSTILE_ID_PREFIX and n in 12 digits (``GPU-00000000-0000-4000-8000-``
    makes NVIDIA-like IDs)."""
    prefix = os.environ.get("HOSTILE_ID_PREFIX", "").encode()
    record = (
        b'{"id":"%s%%012d","health":"HEALTHY"}' % prefix if prefix else b'{"id":"x%d","health":"HEALTHY"}'
    )
    records = [b'{"id":"h-0","health":"HEALTHY"}', b'{"id":"h-1","health":"%s"}' % h1_health.encode()]
    records += [record % n for n in range(count - len(records))]
    head = b'{"jsonrpc":"2.0","method":"devices_changed","params":{"resource":"%s","devices":['
    return head % RESOURCE.encode() + b",".join(records) + b"]}}"


def attack(mode: str) -> None:
    env = os.environ
    if mode == "list":
        line = big_list(int(env["HOSTILE_DEVICES"]))
        log(f"sending a {len(line):,}-byte list of {env['HOSTILE_DEVICES']} devices on purpose")
        write_line(line)
    elif mode == "values":
        values = int(env["HOSTILE_VALUES"])
        grant = b'{"cdi_devices":[' + b",".join([b'"a"'] * values) + b"]}"
        line = (
            b'{"jsonrpc":"2.0","method":"devices_changed","params":{"resource":"%s","devices":['
            b'{"id":"h-0","health":"HEALTHY"},{"id":"h-1","health":"HEALTHY","grant":%s}]}}'
        ) % (RESOURCE.encode(), grant)
        log(f"sending a {len(line):,}-byte list with {values} values on purpose")
        write_line(line)
    elif mode == "numa":
        log("listing h-0 on NUMA node 2**64-1, then h-1 Unhealthy, on purpose")
        devices = [
            {"id": "h-0", "health": "HEALTHY", "numa_nodes": [2**64 - 1]},
            {"id": "h-1", "health": "HEALTHY"},
        ]
        send({"method": "devices_changed", "params": {"resource": RESOURCE, "devices": devices}})
        changes = [{"id": "h-1", "health": "UNHEALTHY"}]
        send({"method": "health_changed", "params": {"resource": RESOURCE, "changes": changes}})


def flood(control: Path, interval_s: float) -> None:
    """The benchmark's flood: a fresh list every interval, as long as the control file says."""
    lines: dict[int, list[bytes]] = {}
    n = 0
    while True:
        time.sleep(interval_s)
        try:
            count = int(control.read_text() or 0)
        except (OSError, ValueError):
            count = 0
        if count > 0:
            if count not in lines:
                lines = {count: [big_list(count, "HEALTHY"), big_list(count, "UNHEALTHY")]}
            write_line(lines[count][n % 2])
            n += 1


def answer(request: dict[str, Any], many: int = 0) -> dict[str, Any] | None:
    """The result of one request; None for a method this driver does not know. ``many``: list
    that many devices instead of DEVICES."""
    method, params = request.get("method"), request.get("params") or {}
    if method == "list_devices" and many:
        return {"devices": [{"id": f"x{n}", "health": "HEALTHY"} for n in range(many)]}
    if method == "initialize":
        return {
            "protocol_version": "1.0.0",
            "driver": {"name": "hostile_lists", "version": "0.0.0"},
            "resources": [{"name": RESOURCE}],
        }
    if method == "list_devices":
        return {"devices": [{"id": i, "health": "HEALTHY"} for i in DEVICES]}
    if method == "allocate":
        return {
            "containers": [{"envs": {"HOSTILE": ",".join(c["device_ids"])}} for c in params["containers"]]
        }
    if method == "shutdown":
        return {}
    return None


def main() -> None:
    env = os.environ
    run_file = Path(env["RUN_FILE"])
    with run_file.open("a") as runs:
        runs.write(f"start {os.getpid()}\n")
    first = sum(line.startswith("start ") for line in run_file.read_text().splitlines()) == 1
    mode = env.get("HOSTILE_MODE", "none")
    if first and mode in ("list", "values", "numa"):
        on_sigusr1(lambda: attack(mode))

    for line in sys.stdin.buffer:
        request = json.loads(line)
        if "id" not in request:
            continue
        many = int(env["HOSTILE_DEVICES"]) if first and mode == "listed" else 0
        result = answer(request, many)
        if result is None:
            send({"id": request["id"], "error": {"code": -32601, "message": "method not found"}})
        else:
            send({"id": request["id"], "result": result})
        if request.get("method") == "list_devices" and mode == "flood":
            control, interval_s = Path(env["HOSTILE_FLOOD_FILE"]), float(env.get("HOSTILE_INTERVAL_S", "1"))
            threading.Thread(target=flood, args=(control, interval_s), daemon=True).start()
        if request.get("method") == "shutdown":
            return


if __name__ == "__main__":
    main()
