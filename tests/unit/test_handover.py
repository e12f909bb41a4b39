"""Handover peers are this resource's sockets of other instances, matched whole: never another
resource's whose name starts the same, and never by a pattern made from the name."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import _async as health_aio
from grpc_health.v1 import health_pb2_grpc

from shim.node.handover import Handover
from shim.settings import socket_prefix
from tests.support.unix import bound_socket


@pytest.fixture
def listening() -> Iterator[list[socket.socket]]:
    """Sockets a test opens, closed at its end."""
    opened: list[socket.socket] = []
    yield opened
    for sock in opened:
        sock.close()


def test_another_resources_sockets_and_requests_are_not_this_ones(
    short_dir: Path, listening: list[socket.socket]
) -> None:
    """example.com/gpu-x's files start with example.com/gpu's prefix: gpu neither waits for its
    live socket, nor removes its dead one, nor lets go when gpu-x is asked to."""
    live, dead = (
        short_dir / "devshim-example.com_gpu-x-bbbbbb.sock",
        short_dir / "devshim-example.com_gpu-x-cccccc.sock",
    )
    listening.append(bound_socket(live, listen=True))
    bound_socket(dead, listen=False).close()
    (short_dir / "devshim-example.com_gpu-x-dddddd.handover").touch()
    gpu = Handover(short_dir, socket_prefix("example.com/gpu"), "aaaaaa")
    assert gpu.live_peers() == []
    assert dead.exists()
    assert not gpu.asked("devshim-example.com_gpu-x-dddddd.handover")
    assert not gpu.asked(None)


def test_the_same_resources_sockets_and_requests_of_other_instances_are_peers(
    short_dir: Path, listening: list[socket.socket]
) -> None:
    live, dead = (
        short_dir / "devshim-example.com_gpu-bbbbbb.sock",
        short_dir / "devshim-example.com_gpu-cccccc.sock",
    )
    listening.append(bound_socket(live, listen=True))
    bound_socket(dead, listen=False).close()
    (short_dir / "devshim-example.com_gpu-dddddd.handover").touch()
    gpu = Handover(short_dir, socket_prefix("example.com/gpu"), "aaaaaa")
    assert gpu.live_peers() == [live]
    assert not dead.exists()  # a crashed instance's leftover
    assert gpu.asked("devshim-example.com_gpu-dddddd.handover")
    assert not gpu.asked("devshim-example.com_gpu-dddddd.handover\n")
    assert gpu.asked(None)


def test_a_name_is_never_a_glob(short_dir: Path, listening: list[socket.socket]) -> None:
    """Were a name like example.com/* ever to reach here, it would match only itself."""
    other = short_dir / "devshim-example.com_gpu-bbbbbb.sock"
    listening.append(bound_socket(other, listen=True))
    (short_dir / "devshim-example.com_gpu-cccccc.handover").touch()
    for prefix in ("devshim-example.com_*", "devshim-example.com_?pu", "devshim-example.com_[g]pu"):
        star = Handover(short_dir, prefix, "aaaaaa")
        assert star.live_peers() == []
        assert not star.asked(None)
    assert other.exists()


async def health_server(path: Path) -> grpc.aio.Server:
    """A gRPC server with the health service on ``path``, as a devshim instance's socket has."""
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health_aio.HealthServicer(), server)
    server.add_insecure_port(f"unix:{path}")
    await server.start()
    return server


async def test_an_instance_that_let_go_waits_while_its_successor_serves_and_no_longer(
    short_dir: Path,
) -> None:
    """After letting go, the old instance waits while the successor answers; once it has
    stopped (its socket removed, three looks in a row) the old one is told to serve again."""
    successor = short_dir / "devshim-example.com_gpu-bbbbbb.sock"
    server = await health_server(successor)
    gpu = Handover(short_dir, socket_prefix("example.com/gpu"), "aaaaaa")
    watching = asyncio.create_task(gpu.until_successor_gone(ready_within_s=0.2, poll_s=0.01))
    try:
        await asyncio.sleep(0.5)  # well past the bound: a successor that serves is waited for
        assert not watching.done()
    finally:
        await server.stop(None)
    async with asyncio.timeout(10):
        assert await watching == "the instance it was handed over to is gone"


async def test_a_successor_that_accepts_connections_but_answers_nothing_is_gone(
    short_dir: Path, listening: list[socket.socket]
) -> None:
    """A successor stopped (SIGSTOP) or hung still accepts connections: the kernel queues them.
    It answers no health check, so after three looks the old instance is told to serve again
    (before: connecting was taken for alive, and it never served again); the successor's file
    is left alone, and taking the resource back does not wait for that one to let go."""
    successor = short_dir / "devshim-example.com_gpu-bbbbbb.sock"
    # Never accepting, with the backlog gRPC's servers get (the system's maximum): each look's
    # connection is queued, and a few hundred looks do not fill the queue.
    listening.append(hung := bound_socket(successor, listen=False))
    hung.listen(4096)
    gpu = Handover(short_dir, socket_prefix("example.com/gpu"), "aaaaaa", timeout_s=60)
    async with asyncio.timeout(10):
        why = await gpu.until_successor_gone(ready_within_s=0.2, poll_s=0.05, answer_s=0.1)
        assert why == "the instance it was handed over to is gone"
        await gpu.take_over()  # at once, not after timeout_s
    assert successor.exists()
    assert not gpu.request.exists()


async def test_an_instance_that_let_go_serves_again_when_no_successor_ever_serves(short_dir: Path) -> None:
    gpu = Handover(short_dir, socket_prefix("example.com/gpu"), "aaaaaa")
    async with asyncio.timeout(10):
        why = await gpu.until_successor_gone(ready_within_s=0.2, poll_s=0.01)
    assert why == "no instance served it within 0.2 s of the handover"
