"""A driver that outlives its stdin: it ignores EOF and SIGTERM (for the orphan test)."""

from __future__ import annotations

import json
import signal
import sys
import time

RESOURCE = "example.com/orphan"
ANSWERS = {
    "initialize": {
        "protocol_version": "1.0.0",
        "driver": {"name": "stubborn"},
        "resources": [{"name": RESOURCE}],
    },
    "list_devices": {"devices": [{"id": "s-0", "health": "HEALTHY"}]},
}

signal.signal(signal.SIGTERM, signal.SIG_IGN)
for line in sys.stdin:
    request = json.loads(line)
    result = ANSWERS.get(request.get("method"), {})
    print(json.dumps({"jsonrpc": "2.0", "id": request.get("id"), "result": result}), flush=True)
while True:  # stdin is closed: a well-behaved driver would exit now; this one stays
    time.sleep(1)
