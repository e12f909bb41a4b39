"""A driver without the SDK, writing raw JSON lines, for misbehaviour the SDK would never allow.

Serves ``example.com/flaky`` with devices ``f-0``, ``f-1``, per-call allocate with the
grant ``{"FLAKY": "<ids>"}``, one request at a time. Its switches come from the
environment (devshim passes exactly the configured ``env``):

RUN_FILE
    Required. Every run appends ``start <pid>`` to it (``shutdown <pid>`` when shutdown
    arrives, ``sigterm <pid>`` when it traps SIGTERM), so a run knows its number and the
    test can count the restarts and see how a run was stopped.
RAW_MISBEHAVE
    What a misbehaving run does. On SIGUSR1 (the test sends it once the kubelet has
    seen the devices, so the misbehaviour happens at a known moment):
    ``garbage`` writes a line that is not JSON;
    ``unknown_id`` writes a response to a request devshim never sent;
    ``oversized`` writes one line longer than the protocol's 32 MiB limit;
    ``close_stdout`` closes its output and keeps running.
    Without a signal: ``stubborn`` never answers shutdown, ignores the end of its
    input and traps SIGTERM, so only SIGKILL ends it; ``late_preference`` declares
    preferred_allocation and answers it only when the next allocate arrives, just
    before answering that (so devshim has given up on the preference by then);
    ``hang_on_allocate_relist_at_eof`` never answers allocate and, once devshim closes
    its input (as it does stopping a run it failed), sends devices_changed with every
    device Healthy, then waits to be killed; ``exit_on_initialize`` exits (code 3) when
    initialize arrives.
    ``none`` (the default) behaves.
RAW_BAD_RUNS
    How many first runs misbehave: a number (default 1) or ``all``.
RAW_LATER_MISBEHAVE
    What the runs after those do, as RAW_MISBEHAVE (default ``none``).
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

from usr1 import on_sigusr1

RESOURCE = "example.com/flaky"
DEVICES = ["f-0", "f-1"]
MAX_LINE_BYTES = 32 * 1024 * 1024  # docs/driver-protocol.md, "Transport and framing"


_write = threading.Lock()


def write_line(data: bytes) -> None:
    """One line on stdout, whole: straight to the file descriptor, no buffering to interleave,
    one writer at a time (the SIGUSR1 thread writes too)."""
    with _write:
        view = memoryview(data + b"\n")
        while view:
            view = view[os.write(1, view) :]


def send(message: dict[str, Any]) -> None:
    write_line(json.dumps({"jsonrpc": "2.0", **message}).encode())


def log(text: str) -> None:
    sys.stderr.write(f"flaky_raw: {text}\n")
    sys.stderr.flush()


def misbehave(mode: str) -> None:
    log(f"misbehaving on purpose: {mode}")
    if mode == "garbage":
        write_line(b"this is not JSON {")
    elif mode == "unknown_id":
        send({"id": 424242, "result": {}})
    elif mode == "oversized":
        filler = "x" * (MAX_LINE_BYTES + 1)
        send({"method": "log", "params": {"level": "INFO", "message": filler}})
    elif mode == "close_stdout":
        # dup2 closes the pipe's write end (devshim reads end of stream) and leaves a valid fd 1.
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)


def answer(request: dict[str, Any], preferred_allocation: bool) -> dict[str, Any] | None:
    """The result of one request; None for a method this driver does not know."""
    method, params = request.get("method"), request.get("params") or {}
    if method == "initialize":
        return {
            "protocol_version": "1.0.0",
            "driver": {"name": "flaky_raw", "version": "0.0.0"},
            "resources": [{"name": RESOURCE, "preferred_allocation": preferred_allocation}],
        }
    if method == "list_devices":
        return {"devices": [{"id": i, "health": "HEALTHY"} for i in DEVICES]}
    if method == "allocate":
        return {"containers": [{"envs": {"FLAKY": ",".join(c["device_ids"])}} for c in params["containers"]]}
    if method == "preferred_allocation":
        return {"containers": [{"device_ids": c["available"][: c["size"]]} for c in params["containers"]]}
    if method == "shutdown":
        return {}
    return None


def main() -> None:
    env = os.environ
    run_file = Path(env["RUN_FILE"])
    with run_file.open("a") as runs:
        runs.write(f"start {os.getpid()}\n")
    run_number = sum(line.startswith("start ") for line in run_file.read_text().splitlines())
    bad_runs = env.get("RAW_BAD_RUNS", "1")
    bad = bad_runs == "all" or run_number <= int(bad_runs)
    mode = env.get("RAW_MISBEHAVE" if bad else "RAW_LATER_MISBEHAVE", "none")
    stubborn = mode == "stubborn"
    late_preference = mode == "late_preference"
    held: dict[str, Any] | None = None  # a preferred_allocation request not answered yet

    if mode in ("garbage", "unknown_id", "oversized", "close_stdout"):
        on_sigusr1(lambda: misbehave(mode))
    if stubborn:

        def trap(signum: int, frame: FrameType | None) -> None:
            with run_file.open("a") as runs:
                runs.write(f"sigterm {os.getpid()}\n")
            log("ignoring SIGTERM")

        signal.signal(signal.SIGTERM, trap)

    for line in sys.stdin.buffer:
        request = json.loads(line)
        if "id" not in request:
            continue
        if request.get("method") == "shutdown":
            with run_file.open("a") as runs:
                runs.write(f"shutdown {os.getpid()}\n")
        if request.get("method") == "initialize" and mode == "exit_on_initialize":
            log(f"run {run_number} got initialize; exiting with code 3 on purpose")
            os._exit(3)
        if request.get("method") == "allocate" and mode == "hang_on_allocate_relist_at_eof":
            log("not answering allocate")
            continue
        if request.get("method") == "shutdown" and stubborn:
            log("ignoring shutdown")
            continue
        if request.get("method") == "preferred_allocation" and late_preference and held is None:
            log("holding the answer to preferred_allocation until the next allocate")
            held = request
            continue
        if request.get("method") == "allocate" and held is not None:
            log("answering preferred_allocation late, then allocate")
            send({"id": held["id"], "result": answer(held, late_preference)})
            held = None
        result = answer(request, late_preference)
        if result is None:
            send({"id": request["id"], "error": {"code": -32601, "message": "method not found"}})
        else:
            send({"id": request["id"], "result": result})
        if request.get("method") == "shutdown":
            return
    if mode == "hang_on_allocate_relist_at_eof":
        log("stdin closed; listing every device Healthy, then waiting to be killed")
        devices = [{"id": i, "health": "HEALTHY"} for i in DEVICES]
        send({"method": "devices_changed", "params": {"resource": RESOURCE, "devices": devices}})
    if stubborn or mode == "hang_on_allocate_relist_at_eof":
        log("stdin closed; staying anyway")
        while True:
            signal.pause()


if __name__ == "__main__":
    main()
