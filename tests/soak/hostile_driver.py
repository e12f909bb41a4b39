"""The soak's hostile driver: raw JSON-RPC lines, no SDK, an attack on every SIGUSR1.

It serves ``example.com/soak-hostile`` (devices ``h-0``, ``h-1``, per-call grants of
``HOSTILE=<ids>``, which its policy allows) and, each time the soak's ``hostile_attack`` fault
signals it, makes the attack that fault wrote into the file HOSTILE_ATTACK_FILE (the soak picks
them in turn: a restart, which some attacks cause, resets nothing). Each is an attack of issue
41's review; devshim must keep it from reaching the kubelet, another resource or devshim's own
log, and keep serving:

``takeover``  declares the other drivers' and the static resource beside its own
              (``resources_changed``): refused, its own kept;
``forge``     a ``log`` notification and a stderr line holding newlines, U+2028, U+0085 and
              U+202E around a line in devshim's own format: escaped, one line each;
``flood``     2,000 ``log`` notifications at once (over 1,000 a second): dropped, counted, and the
              driver restarted;
``grant``     its next three Allocates grant ``LD_PRELOAD`` and ``/dev/kmsg``: refused
              PERMISSION_DENIED by the floor, never seen by the kubelet;
``oversized`` a 60,000-device list (over the 50,000 bound): refused unread, its devices
              Unhealthy, the driver restarted.

The line forged in devshim's text format starts FORGED_STAMP; the soak checks that no line of
devshim's log does.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

RESOURCE = "example.com/soak-hostile"
DEVICES = ("h-0", "h-1")
ATTACKS = ("takeover", "forge", "flood", "grant", "oversized")  # in the order the soak makes them
FORGED_STAMP = "1999-01-01 00:00:00.000 | ERROR   |"
# What the other drivers and devshim serve in the soak (tests/soak/world.py, SERVED).
OTHERS = ("example.com/soak-a", "example.com/soak-b", "example.com/soak-static")
_write = threading.Lock()
_state = {"bad_grants": 0}


def write_line(data: bytes) -> None:
    """One line on stdout, whole: straight to the file descriptor, never interleaved."""
    with _write:
        view = memoryview(data + b"\n")
        while view:
            view = view[os.write(1, view) :]


def send(message: dict[str, Any]) -> None:
    write_line(json.dumps({"jsonrpc": "2.0", **message}).encode())


def attack() -> None:
    kind = Path(os.environ["HOSTILE_ATTACK_FILE"]).read_text().strip()
    if kind == "takeover":
        resources = [{"name": RESOURCE}, *({"name": name} for name in OTHERS)]
        send({"method": "resources_changed", "params": {"resources": resources}})
    elif kind == "forge":
        line = f"{FORGED_STAMP} driver 'soak-a' failed: forged by the hostile driver"
        for separator in ("\n", "\u2028", "\u0085", "\u202e"):
            message = f"fan speed{separator}{line}"
            send({"method": "log", "params": {"level": "INFO", "message": message}})
            sys.stderr.write(f"stderr{separator}{line}\n")
        sys.stderr.flush()
    elif kind == "flood":
        for i in range(2000):
            send({"method": "log", "params": {"level": "INFO", "message": f"flood {i}"}})
    elif kind == "grant":
        _state["bad_grants"] = 3
    elif kind == "oversized":
        records = b",".join(b'{"id":"x%d","health":"HEALTHY"}' % i for i in range(60_000))
        head = b'{"jsonrpc":"2.0","method":"devices_changed","params":{"resource":"%s","devices":['
        write_line(head % RESOURCE.encode() + records + b"]}}")


def grant(ids: list[str]) -> dict[str, Any]:
    if _state["bad_grants"] > 0:
        _state["bad_grants"] -= 1
        return {
            "envs": {"HOSTILE": ",".join(ids), "LD_PRELOAD": "/tmp/evil.so"},
            "device_nodes": [{"container_path": "/dev/kmsg", "host_path": "/dev/kmsg", "permissions": "rw"}],
        }
    return {"envs": {"HOSTILE": ",".join(ids)}}


def answer(method: str, params: dict[str, Any]) -> dict[str, Any] | None:
    if method == "initialize":
        return {
            "protocol_version": "1.0.0",
            "driver": {"name": "soak-hostile", "version": "0.0.0"},
            "resources": [{"name": RESOURCE, "deallocate": True}],
        }
    if method == "list_devices":
        return {"devices": [{"id": i, "health": "HEALTHY"} for i in DEVICES]}
    if method == "allocate":
        return {"containers": [grant(c["device_ids"]) for c in params["containers"]]}
    if method in ("deallocate", "shutdown"):
        return {}
    return None


def main() -> None:
    def on_signal(signum: int, frame: FrameType | None) -> None:
        # In a thread: the handler may interrupt the main thread inside write_line.
        threading.Thread(target=attack).start()

    signal.signal(signal.SIGUSR1, on_signal)
    for line in sys.stdin.buffer:
        request = json.loads(line)
        if "id" not in request:
            continue
        result = answer(request.get("method", ""), request.get("params") or {})
        if result is None:
            send({"id": request["id"], "error": {"code": -32601, "message": "method not found"}})
        else:
            send({"id": request["id"], "result": result})
        if request.get("method") == "shutdown":
            return


if __name__ == "__main__":
    main()
