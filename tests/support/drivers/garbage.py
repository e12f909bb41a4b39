"""A raw-JSON driver that behaves, and writes whatever bytes the fuzz test hands it.

Serves ``example.com/garbage`` with devices ``g-0`` and ``g-1``, answering allocate per call
with the grant ``{"GARBAGE": "<ids>"}`` (so every Allocate is a round trip through this
process). Between requests it polls ``PAYLOAD_DIR`` for ``<n>.bin`` files (the test writes
``<n>.tmp`` and renames it, so a file is whole when seen), claims one by renaming it to
``<n>.taken`` (only one run ever takes it, whichever run is alive), and writes its bytes to
stdout exactly as they are, with two substitutions that need this run's state:

``{{LAST_ID}}``  the JSON id of the last request devshim sent (a duplicate answer to it)
``{{NEXT_ID}}``  that id plus one (an answer before its request)

and ``{{OVERSIZED}}``, replaced by a log notification just over the protocol's 32 MiB line limit.
A payload starting with ``{{HOLD}}`` is written only when the next request arrives, just before
its answer: so an answer to ``{{NEXT_ID}}`` surely meets the request it names.

Each run appends ``start <pid>`` to ``RUN_FILE``; the test counts restarts with it.
No SDK: the SDK would never write such bytes.
"""

from __future__ import annotations

import json
import os
import select
import sys
from pathlib import Path
from typing import Any

RESOURCE = "example.com/garbage"
DEVICES = ["g-0", "g-1"]
MAX_LINE_BYTES = 32 * 1024 * 1024  # docs/driver-protocol.md, "Transport and framing"
POLL_S = 0.02


def write(data: bytes) -> None:
    """Straight to the file descriptor, whole: nothing buffered to interleave."""
    view = memoryview(data)
    while view:
        view = view[os.write(1, view) :]


def answer(request: dict[str, Any]) -> dict[str, Any]:
    method, params = request.get("method"), request.get("params") or {}
    if method == "initialize":
        result: Any = {
            "protocol_version": "1.0.0",
            "driver": {"name": "garbage", "version": "0.0.0"},
            "resources": [{"name": RESOURCE}],
        }
    elif method == "list_devices":
        result = {"devices": [{"id": i, "health": "HEALTHY"} for i in DEVICES]}
    elif method == "allocate":
        result = {
            "containers": [{"envs": {"GARBAGE": ",".join(c["device_ids"])}} for c in params["containers"]]
        }
    elif method == "shutdown":
        result = {}
    else:
        return {"jsonrpc": "2.0", "id": request["id"], "error": {"code": -32601, "message": f"no {method}"}}
    return {"jsonrpc": "2.0", "id": request["id"], "result": result}


def payload(raw: bytes, last_id: Any) -> bytes:
    next_id = last_id + 1 if isinstance(last_id, int) else 1
    raw = raw.replace(b"{{LAST_ID}}", json.dumps(last_id).encode())
    raw = raw.replace(b"{{NEXT_ID}}", json.dumps(next_id).encode())
    if b"{{OVERSIZED}}" in raw:
        filler = b"x" * MAX_LINE_BYTES
        raw = raw.replace(
            b"{{OVERSIZED}}", b'{"jsonrpc":"2.0","method":"log","params":{"message":"' + filler + b'"}}\n'
        )
    return raw


def claim(payloads: Path) -> bytes | None:
    for ready in sorted(payloads.glob("*.bin")):
        taken = ready.with_suffix(".taken")
        try:
            ready.rename(taken)
        except FileNotFoundError:
            continue  # an earlier run took it as it died
        return taken.read_bytes()
    return None


def main() -> None:
    payloads = Path(os.environ["PAYLOAD_DIR"])
    with Path(os.environ["RUN_FILE"]).open("a") as runs:
        runs.write(f"start {os.getpid()}\n")
    pending = b""
    last_id: Any = None
    held = b""
    while True:
        readable, _, _ = select.select([0], [], [], POLL_S)
        if readable:
            chunk = os.read(0, 1 << 16)
            if not chunk:
                return  # devshim closed our input: it is stopping us
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                request = json.loads(line)
                # devshim's answers to requests a payload made are not requests to answer.
                if "id" in request and "method" in request:
                    last_id = request["id"]
                    write(held)
                    held = b""
                    write(json.dumps(answer(request)).encode() + b"\n")
                    if request.get("method") == "shutdown":
                        return
            continue
        raw = claim(payloads)
        if raw is not None:
            sys.stderr.write(f"garbage: writing a {len(raw)}-byte payload\n")
            sys.stderr.flush()
            if raw.startswith(b"{{HOLD}}"):
                held = payload(raw.removeprefix(b"{{HOLD}}"), last_id)
            else:
                write(payload(raw, last_id))


if __name__ == "__main__":
    main()
