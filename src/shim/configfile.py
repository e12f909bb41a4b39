"""Configuration files: read into strict models, and what is wrong with one said per field.

devshim's settings (shim/settings.py) and its drivers' configurations (adapters/, through
shim.sdk.config) are read and reported alike: a misspelt key is an error, never a silently
ignored option, and each problem names its field the way a YAML path reads.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from shim.files import UnreadableFile, read_bounded

# A settings file with ten thousand static devices is under 1 MiB.
CONFIG_FILE_LIMIT = 8 * 1024 * 1024


class ConfigError(Exception):
    """Settings that cannot be used; the message says which and why."""


class StrictModel(BaseModel):
    """A configuration object: unknown keys refused, immutable once read."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def read_config_file(path: Path) -> dict[str, Any]:
    """The mapping a settings file holds; any failure to read or parse is a ConfigError."""
    try:
        raw = read_bounded(path, CONFIG_FILE_LIMIT)
    except UnreadableFile as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 (byte {exc.start} is not)") from None
    import yaml  # here: a start without a config file (`devshim run -r ...`) does without it

    stream = io.StringIO(text)
    stream.name = str(path)  # what YAML's error marks name, instead of "<unicode string>"
    try:
        data = yaml.safe_load(stream)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"config file {path} is nested too deeply to parse") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top, not {type(data).__name__}")
    return data


def format_validation_error(exc: ValidationError, source: Path | str | None, what: str = "settings") -> str:
    """One line per problem, each naming its field (used by devshim and its drivers' configs)."""
    where = f" in {source}" if source else ""
    lines = [f"invalid {what}{where}:"]
    for err in exc.errors():
        lines.append(f"  {location(err['loc'])}: {err['msg']}")
    return "\n".join(lines)


def location(parts: tuple[int | str, ...]) -> str:
    """("resources", 1, "name") -> "resources[1].name", the way a YAML path reads."""
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"
