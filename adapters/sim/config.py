"""The simulator's configuration: a YAML or JSON file, or an inline JSON string.

Grants reuse devshim's own grant template (shim.sdk.grants: ``{ids}`` joins the IDs, ``{id}``
repeats a device node or CDI name per device), so the simulator and the static
source expand a template the same way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from shim.sdk.config import (
    MAX_NUMA_NODE,
    attributes_from_json,
    binding_from_json,
    capacity_from_json,
    capacity_policies_from_json,
    check_extended_resource_name,
    counter_sets_from_json,
    format_validation_error,
    read_config_file,
    refuse_duplicates,
    taints_from_json,
)
from shim.sdk.config import ConfigError as _FileError
from shim.sdk.grants import GrantSettings

DeviceId = Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[^\s,]+$")]
# DRA's typed attributes, in the protocol's JSON form: {"model": {"string": "A100"}}.
Attributes = dict[str, dict[str, int | bool | str]]
Delay = Annotated[float, Field(ge=0, le=600)]
# The cap devshim puts on its own settings file (8 MiB, which read_config_file applies to a file),
# applied to --config-json too; Linux already refuses a single argument over 128 KiB.
INLINE_JSON_LIMIT = 8 * 1024 * 1024


class ConfigError(Exception):
    """A configuration the simulator cannot use; the message names the field."""


class _Strict(BaseModel):
    # A misspelt key is an error, not a silently ignored option.
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Published(_Strict):
    """What DRA publishes of a device (protocol 1.1), checked as devshim checks it."""

    attributes: Attributes = {}
    capacity: dict[str, str] = {}

    @model_validator(mode="after")
    def _dra_limits(self) -> Self:
        attributes_from_json(self.attributes)
        capacity_from_json(self.capacity)
        return self


class DeviceConfig(_Published):
    id: DeviceId
    # devshim's bound (Linux's MAX_NUMNODES is at most 1024): refused here, not as a list later.
    numa_nodes: list[Annotated[int, Field(ge=0, le=MAX_NUMA_NODE, strict=True)]] = []
    healthy: bool = True
    # Protocol 1.3: [{key, value, effect}], as devshim checks them (DRA publishes them).
    taints: list[dict[str, str]] = []
    # Protocol 1.3, partitionable devices: [{name, counters: {counter: quantity}}] this device
    # brings to the pool, and [{counter_set, counters}] taking it uses up.
    counter_sets: list[dict[str, Any]] = []
    consumes_counters: list[dict[str, Any]] = []
    allow_multiple_allocations: bool = False  # claims may share it (the resource's shares: true)
    # {capacity: {default: quantity, valid_values: [...] or valid_range: {min, max, step}}}: what
    # a share asking for none of it takes, and what a share may take.
    capacity_policies: dict[str, dict[str, Any]] = {}
    # Protocol 1.4: {conditions, failure_conditions, binds_to_node} (the resource's attach: true).
    binding: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _dra_13(self) -> Self:
        binding_from_json(self.binding)
        taints_from_json(self.taints)
        counter_sets_from_json(self.counter_sets)
        counter_sets_from_json(self.consumes_counters, "consumes_counters")
        return self


class Delays(_Strict):
    """Seconds to wait before answering, to exercise devshim's concurrency and timeouts."""

    allocate_s: Delay = 0.0
    preferred_allocation_s: Delay = 0.0
    prestart_s: Delay = 0.0


class CdiSpecConfig(_Strict):
    kind: str  # "vendor/class"
    edits: GrantSettings  # envs, mounts and device nodes, for each device


class ResourceConfig(_Published):
    """Either ``count`` devices named ``<id_prefix><n>``, or an explicit ``devices`` list.
    ``attributes`` and ``capacity`` here are every device's, under a device's own."""

    name: str
    # devshim refuses a driver's list of more than 50,000 devices (docs/driver-protocol.md, "Limits").
    count: Annotated[int, Field(ge=0, le=50_000)] | None = None
    devices: list[DeviceConfig] | None = None
    id_prefix: Annotated[str, Field(min_length=1, max_length=40, pattern=r"^[^\s,]+$")] | None = None
    # declared: every device carries its grant in the list; per_call: allocate answers.
    grant_mode: Literal["declared", "per_call"] = "per_call"
    grant: GrantSettings = GrantSettings()
    preferred_allocation: bool = False
    prestart: bool = False
    deallocate: bool = False
    post_stop: bool = False
    # Protocol 1.3: admin-access claims get the same grant, and nothing is taken.
    admin_access: bool = False
    # Protocol 1.3: shares of devices that allow multiple allocations get the devices' grant.
    shares: bool = False
    # Protocol 1.4: devices with a binding are attached when allocated; "failed" answers the
    # first failure condition True (the scheduler then places the pod again).
    attach: bool = False
    attach_answer: Literal["attached", "failed"] = "attached"
    delays: Delays = Delays()
    # Protocol 1.2: a CDI spec the simulator ships, one device per device ID named by the ID,
    # with these edits expanded for that one device as a grant is ({ids} in env values, {id} in
    # device-node paths): grants naming "<cdi_spec.kind>=<id>" then resolve.
    cdi_spec: CdiSpecConfig | None = None

    @field_validator("name")
    @classmethod
    def _extended_name(cls, value: str) -> str:
        return check_extended_resource_name(value)

    @model_validator(mode="after")
    def _one_way_to_name_devices(self) -> Self:
        if (self.count is None) == (self.devices is None):
            raise ValueError("give exactly one of 'count' or 'devices'")
        ids = [d.id for d in self.devices or ()]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"device ID(s) listed twice: {', '.join(dupes)}")
        for device in self.initial_devices():  # with the resource's capacity, as devshim reads it
            capacity = tuple(sorted(device.capacity.items()))
            capacity_policies_from_json(device.capacity_policies, capacity, device.allow_multiple_allocations)
        return self

    @property
    def prefix(self) -> str:
        """``id_prefix``, by default the resource's short name and a dash (example.com/gpu: "gpu-")."""
        return self.id_prefix or self.name.partition("/")[2] + "-"

    def initial_devices(self) -> list[DeviceConfig]:
        devices = self.devices or [DeviceConfig(id=f"{self.prefix}{n}") for n in range(self.count or 0)]
        return [self.with_defaults(d) for d in devices]

    def with_defaults(self, device: DeviceConfig) -> DeviceConfig:
        """``device`` with the resource's attributes and capacity under its own."""
        if not (self.attributes or self.capacity):
            return device
        merged: dict[str, Any] = {"attributes": self.attributes | device.attributes}
        merged["capacity"] = self.capacity | device.capacity
        return device.model_copy(update=merged)


class SimConfig(_Strict):
    resources: list[ResourceConfig] = []
    # Appended lines are commands (adapters/sim/control.py); None: no run-time changes.
    control_file: Path | None = None

    @model_validator(mode="after")
    def _unique_names(self) -> Self:
        refuse_duplicates((r.name for r in self.resources), "resource(s)")
        return self


def load_config(path: Path | None = None, inline_json: str | None = None) -> SimConfig:
    """The configuration from a file (YAML, or JSON, which YAML reads too) or an inline JSON string.

    Read within devshim's bounds, since the simulator runs beside it as root: a file through the
    SDK's read_config_file (a size cap, a FIFO, device or directory refused without blocking, a
    document nested past the parser's depth refused), an inline string under the same caps.
    """
    source = str(path) if path is not None else "--config-json"
    if path is not None:
        try:
            data: Any = read_config_file(path)
        except _FileError as exc:  # the SDK's message names the file and the bound broken
            raise ConfigError(str(exc)) from None
    else:
        data = _parse_inline_json(inline_json or "{}")
    if data is None:  # `null`, like an empty file: no resources yet (they can be added at run time)
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source} must hold a mapping at the top, not {type(data).__name__}")
    try:
        return SimConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source, "simulator config")) from None


def _parse_inline_json(text: str) -> Any:
    """``--config-json``'s value parsed, within the bounds a config file is read under."""
    # Counted in characters: a str from argv may hold surrogates that do not encode to UTF-8.
    if len(text) > INLINE_JSON_LIMIT:
        raise ConfigError(f"cannot read --config-json: it is longer than {INLINE_JSON_LIMIT} characters")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--config-json does not parse: {exc}") from None
    except RecursionError:  # the parser's depth is the bound: say so instead of a traceback
        raise ConfigError("--config-json is nested too deeply to parse") from None
