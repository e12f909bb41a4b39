"""A raw JSON-RPC driver (no SDK) that answers initialize with the protocol version it is given:

    python versioned.py VERSION_JSON

VERSION_JSON is the ``protocol_version`` value as JSON ('"1.x"', '1.3'), so a test can have a
driver answer what no SDK would send. It serves example.com/versioned (one device, v-0), answers
shutdown, and answers any other method "method not found"; the end of its stdin ends it.
"""

from __future__ import annotations

import json
import sys
from typing import Any

RESOURCE = "example.com/versioned"


def answer(request: dict[str, Any], version: object) -> dict[str, Any]:
    method = request.get("method")
    if method == "initialize":
        result = {
            "protocol_version": version,
            "driver": {"name": "versioned"},
            "resources": [{"name": RESOURCE}],
        }
        return {"result": result}
    if method == "list_devices":
        return {"result": {"devices": [{"id": "v-0", "health": "HEALTHY"}]}}
    if method == "shutdown":
        return {"result": {}}
    return {"error": {"code": -32601, "message": f"method not found: {method}"}}


def main() -> None:
    version = json.loads(sys.argv[1])
    for line in sys.stdin:
        request = json.loads(line)
        if "id" not in request:
            continue  # a notification
        sys.stdout.write(
            json.dumps({"jsonrpc": "2.0", "id": request["id"], **answer(request, version)}) + "\n"
        )
        sys.stdout.flush()
        if request.get("method") == "shutdown":
            return


if __name__ == "__main__":
    main()
