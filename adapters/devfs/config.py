"""The devfs driver's configuration: a YAML or JSON file, checked by pydantic.

A misspelt key is an error rather than an ignored option: a device group that
silently matched nothing would look exactly like a node with no devices.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from shim.sdk.config import (
    ConfigError,
    check_extended_resource_name,
    format_validation_error,
    read_config_file,
    refuse_duplicates,
)
from shim.sdk.grants import MountSettings


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GroupConfig(_Strict):
    """One extended resource: the device nodes its globs match, filtered by sysfs attributes."""

    resource: str
    paths: Annotated[list[str], Field(min_length=1)]
    # sysfs attribute name -> exact value, e.g. {"idVendor": "0403"}; all must match.
    sysfs: dict[str, str] = {}
    # How many containers may share one node: the node is listed as this many devices.
    count: Annotated[int, Field(ge=1, le=10_000)] = 1
    permissions: Annotated[str, Field(pattern=r"^[rwm]{1,3}$")] = "rw"
    # Where the node appears in the container; "{name}" is the node's file name. None: the host path.
    container_path: str | None = None
    mounts: list[MountSettings] = []
    # CDI device names; "{id}" is the device ID, "{name}" the node's file name.
    cdi_devices: list[str] = []

    @field_validator("resource")
    @classmethod
    def _extended_name(cls, value: str) -> str:
        return check_extended_resource_name(value)

    @field_validator("paths")
    @classmethod
    def _absolute(cls, value: list[str]) -> list[str]:
        relative = [p for p in value if not p.startswith("/")]
        if relative:
            raise ValueError(f"paths must be absolute: {', '.join(relative)}")
        return value

    @field_validator("container_path")
    @classmethod
    def _absolute_container_path(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError("container_path must be absolute")
        return value


class DevfsConfig(_Strict):
    groups: list[GroupConfig] = []
    # Tests point this at a fake tree; a real node always reads /sys.
    sysfs_root: Path = Path("/sys")
    # inotify on the glob directories where it can, polling for the rest; "poll": polling only.
    watch_mode: Literal["auto", "inotify", "poll"] = "auto"
    poll_interval_s: Annotated[float, Field(gt=0, le=3600)] = 2.0
    # How long a vanished node that is still allocated stays listed Unhealthy without a deallocate.
    vanished_grace_s: Annotated[float, Field(ge=0, le=86_400)] = 300.0

    @model_validator(mode="after")
    def _unique_resources(self) -> Self:
        refuse_duplicates((g.resource for g in self.groups), "resource(s)")
        return self


def load_config(path: Path) -> DevfsConfig:
    """The configuration in ``path`` (YAML, or JSON, which YAML reads too)."""
    data = read_config_file(path)
    try:
        return DevfsConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, path, "devfs config")) from None
