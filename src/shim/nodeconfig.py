"""Per-node configs: a label on this node's Node names the config devshim serves.

One DaemonSet serves a fleet of different nodes (GPU models, driver versions, partitioning),
so one ConfigMap carries several named configs and each node's label picks its own, as NVIDIA's
config-manager does for its device plugin. devshim reads the label before it starts serving and
then watches it: a change is applied as SIGHUP applies a changed file (the drivers and resources
that differ restarted, nothing else), without restarting the pod. No label, or one naming a
config that does not load, leaves the default (or the config in use) serving, and says why.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from loguru import logger

from shim.configfile import ConfigError
from shim.facts import is_label_value
from shim.settings import NodeConfigSettings, Settings

if TYPE_CHECKING:  # the API client (kr8s, httpx: 36 MB) is imported only where configs are followed
    from shim.dra.kube import ApiServer

BACKOFF_S = (0.5, 30.0)  # after a failed list or watch: first wait, longest wait
SHORTEST_WATCH_S = 1.0  # a watch ending sooner than this is a failure, not the server's timeout


class NodeConfigs:
    """The config the node's label names, followed. ``read(path)`` loads a config file (None:
    devshim's without one), as `devshim run` loads --config."""

    def __init__(
        self,
        settings: NodeConfigSettings,
        default: Path | None,
        read: Callable[[Path | None], Settings],
        connect: Callable[[Path | None], Awaitable[ApiServer]] | None = None,
    ) -> None:
        self.settings = settings
        self.name: str | None = None  # the label's value; None while there is none (or unread)
        self.known = asyncio.Event()  # set once the label has been read
        self._default, self._read, self._connect = default, read, connect

    def path(self) -> Path | None:
        """The file the label names, else the default."""
        return self._default if self.name is None else self.settings.folder / f"{self.name}.yaml"

    def load(self) -> Settings:
        """The config the label names (the default without one); ConfigError says which label
        chose a config that does not load."""
        if self.name is None:
            return self._read(self._default)
        where = f"node label {self.settings.label}={self.name}"
        try:
            chosen = self._read(self.path())
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        if chosen.node_configs is not None:
            raise ConfigError(f"{where}: {self.path()} sets node_configs, which only the default config may")
        return chosen.model_copy(update={"node_configs": self.settings})

    async def follow(self, changed: Callable[[], None]) -> None:
        """Until cancelled: the label read, then watched; ``changed()`` each time its value
        changes. Failures are logged and retried with jittered backoff, never raised."""
        from shim.dra.kube import ApiError, ApiServer

        connect = self._connect or ApiServer.connect
        wait, api = BACKOFF_S[0], None
        node = str(self.settings.node_name)
        while True:
            try:
                api = api or await connect(self.settings.kubeconfig)
                labels, since = await api.node_labels(node)
                self._see(labels, changed)
                wait = BACKOFF_S[0]
                started = time.monotonic()
                async for labels in api.watch_node_labels(node, since):
                    self._see(labels, changed)
                if time.monotonic() - started < SHORTEST_WATCH_S:
                    raise ApiError("the watch of the Node ended as soon as it began")
                continue  # the server's timeout: list again
            except ApiError as exc:
                if exc.http_status == 410:  # the watch fell behind: list again at once
                    continue
                logger.warning(
                    "node configs: cannot read node {}'s label {}: {}; trying again in {:.1f}s",
                    node, self.settings.label, exc, wait,
                )  # fmt: skip
            await asyncio.sleep(wait * random.uniform(0.8, 1.2))
            wait = min(wait * 2, BACKOFF_S[1])

    def _see(self, labels: dict[str, str], changed: Callable[[], None]) -> None:
        value = labels.get(self.settings.label) or None
        if value is not None and not is_label_value(value):  # the API server allows none such
            logger.error("node configs: label {}={!r} names no config; ignored", self.settings.label, value)
            value = None
        first = not self.known.is_set()
        self.known.set()
        if value == self.name:
            return
        was, self.name = self.name, value
        logger.info(
            "node configs: label {} is {}{}: serving {}",
            self.settings.label, _said(value), "" if first else f" (was {_said(was)})",
            self.path() or "the command line's settings",
        )  # fmt: skip
        changed()


def _said(value: str | None) -> str:
    return repr(value) if value is not None else "unset"
