"""Binding conditions (protocol 1.4): a device's binding read from a driver as the API server checks
it, published in each resource.k8s.io version's shape where devshim's config allows, and the
attach answer held to what the device declared.

Facts from k8s.io/api resource/v1/types.go and k8s.io/kubernetes pkg/apis/resource/validation
(1.34, 1.37): `bindingConditions`, `bindingFailureConditions` (at most 4 each, label names, no
duplicates, none in both, either both or neither) and `bindsToNode` beside the attributes (under
`basic` in v1beta1), from 1.34 on; v1alpha3 has none. metav1.Condition's reason is CamelCase.
"""

from __future__ import annotations

from typing import Any

import pytest

from shim.dra.slices import BINDINGS, Pool, dropped, spec
from shim.driverhost import protocol
from shim.driverhost.protocol import DriverProtocolError
from shim.driverprotocol import binding_from_json, conditions_from_json
from shim.model import BindingCondition, Device, DeviceBinding
from shim.sdk import types
from shim.sdk.codec import device_json

ATTACHED, FAILED = "gpu.example.com/attached", "gpu.example.com/attach-failed"
BINDING = {"conditions": [ATTACHED], "failure_conditions": [FAILED], "binds_to_node": True}
DECLARED = DeviceBinding((ATTACHED,), (FAILED,), True)


def test_a_drivers_binding_arrives_in_the_model() -> None:
    device, _ = protocol.device_from_json({"id": "gpu-0", "health": "HEALTHY", "binding": BINDING})
    assert device.binding == DECLARED
    camel, _ = protocol.device_from_json(
        {
            "id": "gpu-0",
            "health": "HEALTHY",
            "binding": {"conditions": [ATTACHED], "failureConditions": [FAILED]},
        }
    )
    assert camel.binding == DeviceBinding((ATTACHED,), (FAILED,), False)


@pytest.mark.parametrize(
    ("binding", "said"),
    [
        ({"conditions": [ATTACHED]}, "binding.failure_conditions must be a list of 1 to 4"),
        ({"failure_conditions": [FAILED]}, "binding.conditions must be a list of 1 to 4"),
        ({"conditions": [], "failure_conditions": [FAILED]}, "binding.conditions must be a list of 1 to 4"),
        ({"conditions": [f"c{n}" for n in range(5)], "failure_conditions": [FAILED]}, "1 to 4"),
        ({"conditions": ["not a type!"], "failure_conditions": [FAILED]}, "is not a condition type"),
        ({"conditions": [7], "failure_conditions": [FAILED]}, "is not a condition type"),
        ({"conditions": [ATTACHED, ATTACHED], "failure_conditions": [FAILED]}, "names a condition twice"),
        ({"conditions": [ATTACHED], "failure_conditions": [ATTACHED]}, "both a condition and a failure"),
        (BINDING | {"binds_to_node": "yes"}, "binds_to_node must be true or false"),
        ([ATTACHED], "binding must be an object"),
    ],
)
def test_a_binding_the_api_server_would_refuse_is_refused_with_the_device(binding: Any, said: str) -> None:
    with pytest.raises(DriverProtocolError, match="device 'gpu-0'") as refused:
        protocol.device_from_json({"id": "gpu-0", "health": "HEALTHY", "binding": binding})
    assert said in str(refused.value)
    with pytest.raises(ValueError, match=said.split(" must")[0].split(" is")[0]):
        binding_from_json(binding)


def test_the_sdk_writes_the_binding_and_checks_it_where_it_is_made() -> None:
    binding = types.DeviceBinding(conditions=[ATTACHED], failure_conditions=[FAILED], binds_to_node=True)
    written = device_json(types.Device(id="gpu-0", health=types.Health.HEALTHY, binding=binding))
    assert written["binding"] == BINDING
    assert protocol.device_from_json(written)[0].binding == DECLARED
    with pytest.raises(ValueError, match="device 'gpu-0': binding.failure_conditions"):
        device_json(types.Device(id="gpu-0", binding=types.DeviceBinding(conditions=[ATTACHED])))


def _device(version: str, bindings: bool = True) -> dict[str, Any]:
    pool = Pool.of("gpu.example.com", "node-1", [Device("gpu-0", binding=DECLARED), Device("gpu-1")])
    pool = Pool.named(pool.driver, pool.node, pool.devices, bindings=bindings)
    devices: list[dict[str, Any]] = spec(pool, pool.chunks()[0], 1, 1, version)["devices"]
    return devices[0]


@pytest.mark.parametrize("version", ["v1", "v1beta2"])
def test_published_beside_the_attributes(version: str) -> None:
    device = _device(version)
    assert device["bindingConditions"] == [ATTACHED]
    assert device["bindingFailureConditions"] == [FAILED]
    assert device["bindsToNode"] is True


def test_published_under_basic_in_v1beta1_and_never_in_v1alpha3() -> None:
    assert _device("v1beta1")["basic"]["bindingConditions"] == [ATTACHED]
    assert "bindingConditions" not in _device("v1alpha3")["basic"]


def test_not_published_unless_the_config_allows_and_said_so() -> None:
    assert not {"bindingConditions", "bindingFailureConditions", "bindsToNode"} & set(_device("v1", False))
    pool = Pool.named("d", "n", Pool.of("d", "n", [Device("gpu-0", binding=DECLARED)]).devices)
    assert pool.bindings_unpublished()
    assert not Pool.named("d", "n", pool.devices, bindings=True).bindings_unpublished()


def test_a_server_that_drops_the_binding_says_its_gate() -> None:
    sent = {
        "devices": [{"name": "gpu-0", "bindingConditions": [ATTACHED], "bindingFailureConditions": [FAILED]}]
    }
    assert dropped(sent, {"devices": [{"name": "gpu-0"}]}, "v1") == [BINDINGS]
    assert dropped(sent, sent, "v1") == []


def test_an_attach_answer_sets_only_what_the_device_declares() -> None:
    answer = {
        "conditions": [{"type": ATTACHED, "status": True, "reason": "Attached", "message": "on fabric 2"}]
    }
    assert conditions_from_json(answer, DECLARED) == (
        BindingCondition(ATTACHED, True, "Attached", "on fabric 2"),
    )
    assert conditions_from_json({}, DECLARED) == ()


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        ({"conditions": [{"type": "example.com/other", "status": True}]}, "is not one the device declares"),
        ({"conditions": [{"type": ATTACHED, "status": True}, {"type": ATTACHED}]}, "is answered twice"),
        ({"conditions": [{"type": ATTACHED, "status": "True"}]}, "status must be true or false"),
        ({"conditions": [{"type": ATTACHED, "reason": "not camel"}]}, "is not CamelCase"),
        ({"conditions": [{"type": ATTACHED, "reason": "A" * 129}]}, "is not CamelCase"),
        ({"conditions": [{"type": ATTACHED, "message": "x" * 1025}]}, "message must be a string"),
        ({"conditions": ["attached"]}, "must be an object with type and status"),
        ({"conditions": {"type": ATTACHED}}, "must be an object with a list of conditions"),
        ([], "must be an object with a list of conditions"),
    ],
)
def test_an_attach_answer_outside_the_rules_is_refused(answer: Any, said: str) -> None:
    with pytest.raises(DriverProtocolError, match="attach of 'gpu-0'") as refused:
        protocol.conditions_from_result(answer, "gpu-0", DECLARED)
    assert said in str(refused.value)
