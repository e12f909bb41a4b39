"""docs/driver-protocol.md's examples, executed: checked against the schema and run against the
real simulator, so the contract page cannot drift from the code or the schema.

Lines of a ```jsonrpc block: ``→ {json}`` devshim to driver, ``← {json}`` driver to devshim,
``# control: CMD`` a command appended to the simulator's control file.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml
from google.protobuf import json_format, message_factory
from google.protobuf.message import Message

from shim.sdk.generated.protobuf.driver.v1 import driver_pb2
from tests.support.driver_process import ROOT, running_sim

DOC = ROOT / "docs" / "driver-protocol.md"
_FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_SERVICES = driver_pb2.DESCRIPTOR.services_by_name
# The method table is the schema's: method name -> (params type, result type).
REQUESTS = {
    m.name: (message_factory.GetMessageClass(m.input_type), message_factory.GetMessageClass(m.output_type))
    for m in _SERVICES["Driver"].methods
}
NOTIFICATIONS = {m.name: message_factory.GetMessageClass(m.input_type) for m in _SERVICES["Devshim"].methods}


@dataclass(frozen=True)
class Line:
    kind: Literal["send", "expect", "control"]
    text: str
    where: str  # "docs/driver-protocol.md:123", for failure messages

    @property
    def message(self) -> dict[str, Any]:
        try:
            value = json.loads(self.text)
        except json.JSONDecodeError as exc:
            raise AssertionError(f"{self.where}: not JSON: {exc}") from None
        assert isinstance(value, dict), f"{self.where}: not a JSON object"
        return value


_PREFIXES: dict[str, Literal["send", "expect", "control"]] = {
    "→ ": "send",
    "← ": "expect",
    "# control: ": "control",
}


def read_doc() -> tuple[dict[str, Any], list[Line]]:
    """The sim-config block, and every line of every jsonrpc block in order."""
    text = DOC.read_text(encoding="utf-8")
    config: dict[str, Any] | None = None
    lines: list[Line] = []
    for fence in _FENCE.finditer(text):
        info, body = fence.group(1).split(), fence.group(2)
        first_line = text.count("\n", 0, fence.start(2)) + 1
        if info == ["yaml", "sim-config"]:
            config = yaml.safe_load(body)
        elif info == ["jsonrpc"]:
            for offset, raw in enumerate(body.splitlines()):
                where = f"{DOC.relative_to(ROOT)}:{first_line + offset}"
                if not raw.strip():
                    continue
                prefix = next((p for p in _PREFIXES if raw.startswith(p)), None)
                assert prefix is not None, f"{where}: a jsonrpc line starts with →, ← or '# control: '"
                lines.append(Line(_PREFIXES[prefix], raw[len(prefix) :], where))
    assert config is not None, "no ```yaml sim-config block"
    assert lines, "no ```jsonrpc blocks"
    return config, lines


def check_envelope(message: dict[str, Any], where: str) -> Literal["request", "notification", "response"]:
    """JSON-RPC 2.0's own rules for one message, and which kind it is."""
    assert message.get("jsonrpc") == "2.0", f"{where}: jsonrpc must be '2.0'"
    if "method" in message:
        assert isinstance(message["method"], str), f"{where}: method must be a string"
        assert set(message) <= {"jsonrpc", "id", "method", "params"}, f"{where}: unexpected members"
        assert isinstance(message.get("params", {}), dict), f"{where}: params must be an object"
        if "id" not in message:
            return "notification"
        assert type(message["id"]) in (int, str), f"{where}: id must be a number or a string"
        return "request"
    assert type(message.get("id")) in (int, str), f"{where}: a response needs the request's id"
    assert set(message) in ({"jsonrpc", "id", "result"}, {"jsonrpc", "id", "error"}), (
        f"{where}: a response has exactly one of result and error"
    )
    if "error" in message:
        error = message["error"]
        assert isinstance(error, dict) and set(error) <= {"code", "message", "data"}, f"{where}: bad error"
        assert type(error.get("code")) is int and isinstance(error.get("message"), str), f"{where}: bad error"
    return "response"


def parse(cls: type[Message], value: Any, where: str) -> Message:
    """``value`` as a ``cls`` message: fails on anything the schema does not allow."""
    try:
        return json_format.ParseDict(value, cls(), ignore_unknown_fields=False)
    except json_format.ParseError as exc:
        raise AssertionError(f"{where}: not a valid {cls.DESCRIPTOR.name}: {exc}") from None


def assert_same(cls: type[Message], expected: Any, actual: Any, where: str) -> None:
    """Compared as schema messages: field order, omitted defaults and name forms do not matter."""
    want, got = parse(cls, expected, where), parse(cls, actual, f"{where} (the simulator's answer)")
    assert got == want, (
        f"{where}: the simulator sent\n  {json_format.MessageToDict(got, preserving_proto_field_name=True)}\n"
        f"where the doc says\n  {json_format.MessageToDict(want, preserving_proto_field_name=True)}"
    )


def methods_by_id(lines: list[Line]) -> dict[Any, str]:
    ids: dict[Any, str] = {}
    for line in lines:
        if line.kind == "send":
            message = line.message
            assert message["id"] not in ids, f"{line.where}: id {message['id']} is used twice"
            ids[message["id"]] = message["method"]
    return ids


def test_every_method_and_notification_has_an_example() -> None:
    """Each method of the schema's Driver service is sent, and each notification of its Devshim
    service is shown, in at least one example; no example uses a method the schema lacks."""
    _, lines = read_doc()
    sent = {line.message["method"] for line in lines if line.kind == "send"}
    notified = {
        line.message["method"] for line in lines if line.kind == "expect" and "method" in line.message
    }
    assert sorted(set(REQUESTS) - sent) == [], "methods without an example"
    assert sorted(set(NOTIFICATIONS) - notified) == [], "notifications without an example"
    assert sent <= set(REQUESTS) and notified <= set(NOTIFICATIONS), "examples of methods the schema lacks"


def test_every_example_is_json_rpc_2_0_and_fits_the_schema() -> None:
    """Every → and ← line is a valid JSON-RPC 2.0 envelope whose params or result parse as the
    method's schema message; devshim sends only requests, the driver only answers and notifications."""
    _, lines = read_doc()
    ids = methods_by_id(lines)
    for line in lines:
        if line.kind == "control":
            continue
        message = line.message
        kind = check_envelope(message, line.where)
        if line.kind == "send":
            assert kind == "request", f"{line.where}: devshim sends requests"
            parse(REQUESTS[message["method"]][0], message.get("params", {}), line.where)
        elif kind == "notification":
            parse(NOTIFICATIONS[message["method"]], message.get("params", {}), line.where)
        else:
            assert kind == "response", f"{line.where}: the driver sends no requests"
            assert message["id"] in ids, f"{line.where}: answers no request of the examples"
            if "result" in message:
                parse(REQUESTS[ids[message["id"]]][1], message["result"], line.where)


async def test_the_simulator_answers_every_example_as_documented(tmp_path: Path) -> None:
    """The real simulator, configured by the doc's sim-config block, answers each → line and sends
    each notification exactly as the ← lines say (responses matched by id, notifications by
    method), sends nothing else, and exits 0 once its stdin is closed after shutdown."""
    config, lines = read_doc()
    control = tmp_path / "control"
    control.touch()
    ids = methods_by_id(lines)
    async with running_sim({**config, "control_file": str(control)}, tmp_path) as sim:
        for line in lines:
            if line.kind == "control":
                with control.open("a") as f:
                    f.write(line.text + "\n")
            elif line.kind == "send":
                await sim.send(line.message)
            elif "id" in (expected := line.message):
                actual = await sim.wait_for(id=expected["id"])
                check_envelope(actual, f"{line.where} (the simulator's answer)")
                if "error" in expected:
                    assert "error" in actual, f"{line.where}: expected an error, got {actual}"
                    got = (actual["error"]["code"], actual["error"]["message"])
                    assert got == (expected["error"]["code"], expected["error"]["message"]), line.where
                else:
                    assert "result" in actual, f"{line.where}: expected a result, got {actual}"
                    assert_same(
                        REQUESTS[ids[expected["id"]]][1], expected["result"], actual["result"], line.where
                    )
            else:
                actual = await sim.wait_for(method=expected["method"])
                check_envelope(actual, f"{line.where} (the simulator's notification)")
                assert_same(
                    NOTIFICATIONS[expected["method"]],
                    expected.get("params", {}),
                    actual.get("params", {}),
                    line.where,
                )
        assert await sim.finish() == 0, sim.stderr
        assert sim.unmatched == [], "messages the examples do not show"


@pytest.mark.parametrize(
    ("message", "problem"),
    [
        ({"jsonrpc": "2.0", "id": 1, "result": {}, "error": {"code": 1, "message": ""}}, "exactly one"),
        ({"jsonrpc": "1.0", "id": 1, "result": {}}, "'2.0'"),
        ({"jsonrpc": "2.0", "method": "log", "params": [1]}, "object"),
        ({"jsonrpc": "2.0", "id": 1, "error": {"code": "x", "message": ""}}, "bad error"),
    ],
    ids=["result-and-error", "version-1.0", "positional-params", "string-code"],
)
def test_the_envelope_check_rejects_what_json_rpc_2_0_forbids(message: dict[str, Any], problem: str) -> None:
    """The checker that guards the examples is not vacuous: broken envelopes fail it."""
    with pytest.raises(AssertionError, match=problem):
        check_envelope(message, "here")


def test_the_schema_check_rejects_a_misspelt_field() -> None:
    """Examples are parsed strictly: a field the schema lacks, or of the wrong type, fails."""
    with pytest.raises(AssertionError, match="ListDevicesParams"):
        parse(REQUESTS["list_devices"][0], {"resources": "example.com/sim"}, "here")
    with pytest.raises(AssertionError, match="ListDevicesParams"):
        parse(REQUESTS["list_devices"][0], {"resource": 5}, "here")
