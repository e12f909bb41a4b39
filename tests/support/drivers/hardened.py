"""A driver that shows who it runs as and can flood its stderr, for the hardening tests.

Standard library only (no SDK), so any Python 3 can run it, even one devshim's own virtual
environment is out of reach for (a driver run as ``nobody``).

Serves ``example.com/who``. Its device IDs say what the driver saw of itself, so the kubelet's
device list proves it: ``uid-<uid>``, ``gid-<gid>``, ``groups-<g>_<g>...`` (sorted), and
``env-<names>`` (the sorted names of the environment it was started with, ``_``-joined;
``env-`` alone when empty; read from /proc, as its interpreter may add LC_CTYPE to its own).
The same is written to stderr at start.

Environment switches:

HARDENED_FLOOD_LINES
    Lines (``flood <n>``) written to stderr while answering each ``allocate``, before the
    answer: a devshim that stops reading stderr blocks the driver there, and Allocate with it.
HARDENED_HUGE_BYTES
    Bytes of one line without a newline written first in the same place; after them comes
    ``\\nmarker <ids>`` (so the huge line ends), then the flood.
HARDENED_LOG_FLOOD
    ``log`` notifications sent while answering each ``allocate``, before the answer: the first
    forges a second log line (``forged\n<time> | ERROR | resource=example.com/other | ...``),
    every one carries 64 KiB of text.
HARDENED_STAY
    When set, the driver stays after its input ends, until a signal ends it (so only the
    parent-death signal can end it when devshim is killed).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

RESOURCE = "example.com/who"


def identity() -> list[str]:
    groups = "_".join(str(g) for g in sorted(os.getgroups()))
    with open("/proc/self/environ", "rb") as given:
        names = "_".join(sorted(e.split(b"=")[0].decode() for e in given.read().split(b"\0") if e))
    return [f"uid-{os.getuid()}", f"gid-{os.getgid()}", f"groups-{groups}", f"env-{names}"]


def send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
    sys.stdout.flush()


def write_stderr(data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(2, view) :]


def noise(ids: list[str]) -> None:
    huge = int(os.environ.get("HARDENED_HUGE_BYTES", "0"))
    flood = int(os.environ.get("HARDENED_FLOOD_LINES", "0"))
    block = b"x" * (1024 * 1024)
    while huge > 0:
        write_stderr(block[: min(huge, len(block))])
        huge -= len(block)
    write_stderr(f"\nmarker {','.join(ids)}\n".encode())
    lines = b"".join(f"flood {n}\n".encode() for n in range(flood))
    write_stderr(lines)


def log_flood(ids: list[str]) -> None:
    padding = "y" * 65536
    forged = (
        "forged\n2026-12-01 00:00:00.000 | ERROR   | resource=example.com/other | example.com/other: gone"
    )
    for n in range(int(os.environ.get("HARDENED_LOG_FLOOD", "0"))):
        message = forged if n == 0 else f"log {n} {','.join(ids)} {padding}"
        send({"method": "log", "params": {"level": "ERROR", "message": message}})


def answer(method: str, params: dict[str, Any]) -> dict[str, Any] | None:
    if method == "initialize":
        return {
            "protocol_version": "1.0.0",
            "driver": {"name": "hardened", "version": "0.0.0"},
            "resources": [{"name": RESOURCE}],
        }
    if method == "list_devices":
        return {"devices": [{"id": i, "health": "HEALTHY"} for i in identity()]}
    if method == "allocate":
        ids = [i for c in params["containers"] for i in c["device_ids"]]
        noise(ids)
        log_flood(ids)
        return {"containers": [{"envs": {"WHO": ",".join(c["device_ids"])}} for c in params["containers"]]}
    if method == "shutdown":
        return {}
    return None


def main() -> None:
    write_stderr(f"hardened: running as {' '.join(identity())}\n".encode())
    for line in sys.stdin.buffer:
        request = json.loads(line)
        if "id" not in request:
            continue
        result = answer(request["method"], request.get("params") or {})
        if result is None:
            send({"id": request["id"], "error": {"code": -32601, "message": "method not found"}})
        else:
            send({"id": request["id"], "result": result})
        if request["method"] == "shutdown":
            return
    if os.environ.get("HARDENED_STAY"):
        while True:
            signal.pause()


if __name__ == "__main__":
    main()
