"""Handing a resource over between two devshim instances on one node (a rolling update).

Each instance serves a resource on a socket of its own, ``devshim-<resource>-<instance>.sock``.
A new instance that finds a live socket of another instance for the same resource asks it to let
go, by creating ``devshim-<resource>-<instance>.handover`` beside the sockets, and waits for the
other socket to disappear (at most ``timeout_s``: an old devshim without handover, or a hung one,
does not hold the node hostage) before it serves and registers. The old instance, seeing the
request, closes its streams and server and stops registering that resource. So the old stream has
always ended before the new registration arrives, which kubelets before kubernetes PR #135437
need: there a replaced stream that ends late tears down the new registration (#121994).

The old instance then watches its successor: should the new instance go away (it crashed, or was
rolled back), hang, or never serve within ``SUCCESSOR_READY_S``, the old one serves the resource
again rather than leave the node without it. Alive means answering a gRPC health check (every
devshim socket serves one) within ``ANSWER_S``: a stopped or hung process's socket still accepts
connections (the kernel queues them), so accepting one proves nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from loguru import logger

from shim.node import sockets

SUFFIX = ".handover"
# A request older than this is a leftover of an instance that died mid-handover.
FRESH_S = 30.0
# How long a successor may take to serve after we let go, and how often we look at it.
SUCCESSOR_READY_S = 30.0
SUCCESSOR_POLL_S = 0.5
# How long a successor has to answer one look; three missed looks in a row and it is gone.
ANSWER_S = 2.0
MISSES = 3


async def answers(path: Path, timeout_s: float = ANSWER_S) -> bool:
    """The server on the socket at ``path`` answers a health check within ``timeout_s`` (any
    answer: only a process that runs can give one)."""
    async with grpc.aio.insecure_channel(f"unix:{path}") as channel:
        try:
            await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=timeout_s
            )
        except grpc.aio.AioRpcError as err:
            return err.code() not in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE)
    return True


class Handover:
    """The handover of one resource's socket, seen from one instance.

    ``prefix``: the resource's socket name without instance and extension
    (``devshim-example.com_gpu``); ``instance``: this instance's id.
    """

    def __init__(self, socket_dir: Path, prefix: str, instance: str, timeout_s: float = 10.0) -> None:
        self.socket_dir = socket_dir
        self.prefix = prefix
        self.instance = instance
        self.timeout_s = timeout_s
        self.request = socket_dir / f"{prefix}-{instance}{SUFFIX}"
        self._renamed = 0  # how often the kubelet made us move to a fresh socket name
        # This resource's files of any instance (ids are hex), matched whole, never globbed: the
        # prefix of example.com/gpu is also the start of example.com/gpu-x's files, and a name
        # is not a pattern. A "*" there once made every other resource's socket a peer.
        self._socket = re.compile(re.escape(prefix) + r"-[0-9a-f]+\.sock")
        self._request = re.compile(re.escape(prefix) + r"-[0-9a-f]+" + re.escape(SUFFIX))
        # Sockets of a successor found hung (until_successor_gone): not waited for again.
        self._hung: set[sockets.FileIdentity] = set()

    @property
    def socket_name(self) -> str:
        # A rename appends hex digits: still this resource's pattern, and never another
        # instance's name (instance ids are of one fixed length).
        renamed = f"{self._renamed:x}" if self._renamed else ""
        return f"{self.prefix}-{self.instance}{renamed}.sock"

    def rename(self) -> str:
        """A fresh socket name for this instance, when the kubelet holds the old path as taken."""
        self._renamed += 1
        return self.socket_name

    def _mine(self, pattern: re.Pattern[str]) -> list[Path]:
        """Files of this resource, of any instance, in the socket directory."""
        try:
            names = os.listdir(self.socket_dir)
        except OSError:  # as glob did: a directory gone or unreadable has no peers
            return []
        return [self.socket_dir / name for name in names if pattern.fullmatch(name)]

    def _others(self) -> list[Path]:
        mine = self.socket_name
        return [p for p in self._mine(self._socket) if p.name != mine]

    def live_peers(self) -> list[Path]:
        """Other instances' sockets for this resource that answer; dead ones are removed."""
        live = []
        for path in self._others():
            if sockets.answers(path):
                live.append(path)
            else:  # a crashed instance's leftover: nobody serves it, the kubelet has no use for it
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        return live

    async def take_over(self) -> None:
        """Ask every live peer to let go of the resource and wait until they have (or time out)."""
        peers = self.live_peers()
        hung = [p for p in peers if sockets.identity(p) in self._hung]
        if hung:  # it cannot let go: waiting for it would only leave the node without the resource
            logger.warning(
                "handover: not waiting for {}, which answers nothing", ", ".join(p.name for p in hung)
            )
            peers = [p for p in peers if p not in hung]
        if not peers:
            return
        logger.info("handover: asking {} to let go", ", ".join(p.name for p in peers))
        self.request.touch()
        deadline = time.monotonic() + self.timeout_s
        try:
            while any(p.exists() for p in peers):
                if time.monotonic() > deadline:
                    logger.warning(
                        "handover: {} still there after {:g} s; registering anyway",
                        ", ".join(p.name for p in peers if p.exists()),
                        self.timeout_s,
                    )
                    return
                await asyncio.sleep(0.05)
            logger.info("handover: the previous instance let go")
        finally:
            with contextlib.suppress(FileNotFoundError):
                self.request.unlink()

    def asked(self, name: str | None) -> bool:
        """Another instance asks us to let go: ``name`` (a file just created beside our socket) is
        a fresh request, or, with ``name`` None (a polling watcher), one is there."""
        if name is None:
            return any(self.asked(p.name) for p in self._mine(self._request))
        if not self._request.fullmatch(name) or name == self.request.name:
            return False
        try:
            age = time.time() - os.stat(self.socket_dir / name).st_mtime
        except FileNotFoundError:
            return False
        return age < FRESH_S

    async def until_successor_gone(
        self, ready_within_s: float = SUCCESSOR_READY_S, poll_s: float = SUCCESSOR_POLL_S,
        answer_s: float = ANSWER_S,
    ) -> str:  # fmt: skip
        """After letting go: return once no other instance serves this resource, which is either
        gone (its socket there, answering no health check within ``answer_s`` at three looks in
        a row, so one that is only re-binding or slow is not taken for gone; or its socket
        removed) or never came (no socket within ``ready_within_s``); the return value says
        which. Nothing is removed here: the files are the successor's."""
        deadline = time.monotonic() + ready_within_s
        misses, served = 0, False
        while True:
            others = self._others()
            if any([await answers(path, answer_s) for path in others]):
                misses, served = 0, True
            elif others or served:  # there, answering nothing; or it served and removed its socket
                misses += 1
                if misses >= MISSES:
                    self._hung = {i for path in others if (i := sockets.identity(path)) is not None}
                    return "the instance it was handed over to is gone"  # docs/operations.md
            elif time.monotonic() > deadline:
                return f"no instance served it within {ready_within_s:g} s of the handover"
            await asyncio.sleep(poll_s)
