"""A driver that stops reading its input once it has listed its devices, and runs on.

Raw JSON lines, no SDK. Serves example.com/deaf (devices d-0, d-1, grants per call). After
answering list_devices it closes its stdin (fd 0 becomes /dev/null), so devshim's next request
finds the pipe broken, while the process stays alive and its stdout open: the case where a driver
dies as devshim writes to it, made deterministic.
"""

from __future__ import annotations

import json
import os
import sys
import time

RESOURCE = "example.com/deaf"


def send(message: dict[str, object]) -> None:
    os.write(1, json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")


def main() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        method, rid = request.get("method"), request.get("id")
        if method == "initialize":
            resource = {"name": RESOURCE}
            send({"id": rid, "result": {"protocol_version": "1.0.0", "resources": [resource]}})
        elif method == "list_devices":
            devices = [{"id": d, "health": "HEALTHY"} for d in ("d-0", "d-1")]
            send({"id": rid, "result": {"devices": devices}})
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # closes the pipe's read end
            while True:
                time.sleep(60)


if __name__ == "__main__":
    main()
