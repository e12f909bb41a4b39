"""Running devshim in-process against the fake kubelet, for the behaviour tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

from loguru import logger

from shim.bootstrap import Shim
from shim.settings import Settings
from shim.sources import StaticSource

FOO = "example.com/foo"
BAR = "example.com/bar"


def settings_for(
    plugin_dir: Path,
    resources: dict[str, dict[str, Any]],
    *,
    policies: dict[str, dict[str, Any]] | None = None,
    **extra: Any,
) -> Settings:
    """Settings serving each resource from a static source described by its dict, under its
    grant policy in ``policies`` (where none is given, what its static grant holds)."""
    return Settings.load(
        device_plugins_dir=plugin_dir,
        resources=[
            {"name": name, "static": static, "policy": (policies or {}).get(name)}
            for name, static in resources.items()
        ],
        # Fast backoff keeps restart tests quick; the default is 5 s.
        register_backoff_max_s=extra.pop("register_backoff_max_s", 0.5),
        **extra,
    )


@asynccontextmanager
async def running_shim(
    plugin_dir: Path, resources: dict[str, dict[str, Any]], **extra: Any
) -> AsyncIterator[tuple[Shim, dict[str, StaticSource]]]:
    """A started Shim plus its static sources (the seam tests use to change devices)."""
    settings = settings_for(plugin_dir, resources, **extra)
    sources = {r.name: StaticSource.from_settings(r.static) for r in settings.resources}
    shim = Shim(settings, dict(sources))
    async with shim:
        yield shim, sources


@contextmanager
def logged(level: str) -> Iterator[list[str]]:
    """The messages of devshim's log lines at ``level`` or worse while the block runs."""
    messages: list[str] = []
    sink = logger.add(lambda m: messages.append(m.record["message"]), level=level)
    try:
        yield messages
    finally:
        logger.remove(sink)
