"""Drive one driver command through one vector file (README.md here says the format).

The driver is a real subprocess; each step writes a line to its stdin and waits, under a deadline,
for what the step expects on its stdout. Answers are compared as schema messages: both sides
parsed by protobuf's proto3 JSON parser into the method's result type (the schema's Driver
service names it), so field order, omitted defaults and camelCase do not matter, and an answer
the schema does not allow fails.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

from shim.driverprotocol import PROTOCOL_MAJOR
from shim.sdk.generated.protobuf.driver.v1 import driver_pb2

VECTORS = Path(__file__).parent / "vectors"
DEADLINE_S = 10.0
_DRIVER = driver_pb2.DESCRIPTOR.services_by_name["Driver"]
_NOTIFY = driver_pb2.DESCRIPTOR.services_by_name["Devshim"]
_PLACEHOLDER = re.compile(r"\$\{(\w+)\}")


class Mismatch(AssertionError):
    """The driver answered otherwise than the vector says."""


def vector_files() -> list[str]:
    return sorted(p.stem for p in VECTORS.glob("*.json"))


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((VECTORS / f"{name}.json").read_text(encoding="utf-8"))
    return data


def normalized(type_name: str, value: Any) -> dict[str, Any]:
    """``value`` as the schema's ``type_name`` reads it, in one canonical dict; Mismatch if the
    schema refuses it."""
    message: Message = getattr(driver_pb2, type_name)()
    try:
        json_format.ParseDict(value, message)
    except json_format.ParseError as exc:
        raise Mismatch(f"not a valid {type_name}: {exc}\n{json.dumps(value)[:2000]}") from None
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def matches(expected: Any, actual: Any) -> bool:
    """Subset match with the vectors' two wildcards: "$any" (present), "$major" (semver, our major)."""
    if expected == "$any":
        return True
    if expected == "$major":
        return isinstance(actual, str) and actual.split(".")[0] == PROTOCOL_MAJOR
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(
            k in actual and matches(v, actual[k]) for k, v in expected.items()
        )
    if isinstance(expected, list):
        return (
            isinstance(actual, list) and len(expected) == len(actual) and all(map(matches, expected, actual))
        )
    return bool(expected == actual)


@dataclass
class Session:
    """One driver process and what it has written so far."""

    process: asyncio.subprocess.Process
    values: dict[str, Any] = field(default_factory=dict)
    answers: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)
    notices: list[dict[str, Any]] = field(default_factory=list)
    stdout_closed: asyncio.Event = field(default_factory=asyncio.Event)

    async def pump(self) -> None:
        assert self.process.stdout is not None
        while line := await self.process.stdout.readline():
            message = json.loads(line)  # a line that is not JSON fails the session here
            if "method" in message and "id" not in message:
                self.notices.append(message)
            else:
                await self.answers.put(message)
        self.stdout_closed.set()

    def fill(self, value: Any) -> Any:
        """``${name}`` placeholders replaced by what earlier steps captured."""
        if isinstance(value, str):
            whole = _PLACEHOLDER.fullmatch(value)
            if whole:
                return self.values[whole.group(1)]
            return _PLACEHOLDER.sub(lambda m: str(self.values[m.group(1)]), value)
        if isinstance(value, dict):
            return {k: self.fill(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.fill(v) for v in value]
        return value

    async def write(self, data: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(data + b"\n")
        await self.process.stdin.drain()

    async def step(self, index: int, step: dict[str, Any]) -> None:
        where = f"step {index} ({step.get('about', '')})"
        seen = len(self.notices)
        request: Any = None
        if "send" in step:
            request = self.fill(step["send"])
            await self.write(json.dumps(request).encode())
        elif "send_raw" in step:
            await self.write(step["send_raw"].encode())
        elif "send_hex" in step:
            await self.write(bytes.fromhex(step["send_hex"]))
        if step.get("close_stdin"):
            assert self.process.stdin is not None
            self.process.stdin.close()
        if "answer" in step:
            await self.check_answer(where, request, step["answer"])
        if "notifications" in step:
            self.check_notifications(where, seen, step["notifications"])
        if "exit" in step:
            async with asyncio.timeout(DEADLINE_S):
                code = await self.process.wait()
            if code != step["exit"]:
                raise Mismatch(f"{where}: exited {code}, expected {step['exit']}")
        if not self.answers.empty():
            raise Mismatch(f"{where}: an answer nothing asked for: {self.answers.get_nowait()}")

    async def check_answer(self, where: str, request: Any, expected: dict[str, Any]) -> None:
        try:
            async with asyncio.timeout(DEADLINE_S):
                answer = await self.answers.get()
        except TimeoutError:
            raise Mismatch(f"{where}: no answer within {DEADLINE_S} s") from None
        sent_id = request.get("id") if isinstance(request, dict) else None
        wanted_ids = [None, sent_id] if expected.get("id") == "either" else [expected.get("id", sent_id)]
        if answer.get("id") not in wanted_ids or answer.get("jsonrpc") != "2.0":
            raise Mismatch(f"{where}: expected an answer with id in {wanted_ids}, got {answer}")
        if "error" in expected:
            error = answer.get("error")
            want = self.fill(expected["error"])
            if not isinstance(error, dict) or "result" in answer:
                raise Mismatch(f"{where}: expected error {want}, got {answer}")
            codes = want.get("code_in", [want.get("code")])
            if error.get("code") not in codes or (
                "message" in want and error.get("message") != want["message"]
            ):
                raise Mismatch(f"{where}: expected error {want}, got {error}")
            return
        if "result" not in answer or "error" in answer:
            raise Mismatch(f"{where}: expected a result, got {answer}")
        method = request["method"]
        result_type = _DRIVER.methods_by_name[method].output_type.name
        got = normalized(result_type, answer["result"])
        if "result" in expected:
            want = normalized(result_type, self.fill(expected["result"]))
            if "protocol_version" in want:  # any minor of ours: checked, then set aside
                if not matches("$major", got.get("protocol_version")):
                    raise Mismatch(
                        f"{where}: protocol_version {got.get('protocol_version')!r} is not of our major"
                    )
                got["protocol_version"] = want["protocol_version"]
            if got != want:
                shown = (json.dumps(m, sort_keys=True) for m in (want, got))
                raise Mismatch(f"{where}: expected\n{next(shown)}\ngot\n{next(shown)}")
        if "result_has" in expected and not matches(self.fill(expected["result_has"]), got):
            raise Mismatch(f"{where}: {got} does not match {expected['result_has']}")
        for name, length in expected.get("count", {}).items():
            if len(got.get(name, [])) != self.fill(length):
                raise Mismatch(f"{where}: expected {length} {name}, got {got.get(name)}")
        self.capture(expected.get("capture", {}), got)

    def capture(self, spec: dict[str, str], got: dict[str, Any]) -> None:
        for name, path in spec.items():
            if path == "healthy device ids":
                healthy = [d["id"] for d in got.get("devices", []) if d.get("health") == "HEALTHY"]
                if len(healthy) < 2:
                    raise Mismatch(
                        f"the conformance vectors need two healthy devices, the driver lists {healthy}"
                    )
                self.values.update({f"{name}{i}": v for i, v in enumerate(healthy)})
                continue
            value: Any = got
            for part in path.split("."):
                value = value[int(part)] if isinstance(value, list) else value[part]
            self.values[name] = value

    def check_notifications(self, where: str, seen: int, expected: list[dict[str, Any]]) -> None:
        got = self.notices[seen:]
        if [n.get("method") for n in got] != [n["method"] for n in expected]:
            raise Mismatch(f"{where}: expected notifications {[n['method'] for n in expected]}, got {got}")
        for want, notice in zip(expected, got, strict=True):
            type_name = _NOTIFY.methods_by_name[want["method"]].input_type.name
            if normalized(type_name, notice.get("params")) != normalized(
                type_name, self.fill(want["params"])
            ):
                raise Mismatch(f"{where}: expected {want}, got {notice}")


async def run_vector(command: list[str], name: str, env: dict[str, str], stderr: Path) -> None:
    """Run vector file ``name`` against a fresh ``command``; Mismatch says where it differs."""
    with stderr.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
            env=env,
            limit=1 << 25,
        )
    session = Session(process)
    pump = asyncio.create_task(session.pump())
    try:
        for index, step in enumerate(load(name)["steps"], 1):
            await session.step(index, step)
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()
        await asyncio.wait([pump], timeout=DEADLINE_S)
        if pump.done() and not pump.cancelled() and pump.exception() is not None:
            raise Mismatch(f"the driver wrote a line that is not JSON: {pump.exception()}")
