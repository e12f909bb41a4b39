"""A value that changes over time, followed by any number of readers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Generic, TypeVar

T = TypeVar("T")


class Latest(Generic[T]):
    """Holds the newest value; each follower gets it at once, then every newer one.

    A follower that is slow skips straight to the newest value: for device
    lists the kubelet wants the current state, not a replay of every step.
    """

    def __init__(self) -> None:
        self._value: T | None = None
        self._generation = 0
        self._changed = asyncio.Condition()

    @property
    def value(self) -> T | None:
        """The newest value, None before the first publish."""
        return self._value

    async def publish(self, value: T) -> None:
        async with self._changed:
            self._value = value
            self._generation += 1
            self._changed.notify_all()

    async def follow(self) -> AsyncGenerator[T, None]:
        seen = 0
        while True:
            async with self._changed:
                while self._generation == seen:
                    await self._changed.wait()
                seen = self._generation
                value = self._value
            assert value is not None  # only published values are ever yielded
            yield value
