"""The ops HTTP server: probes and /status from a real devshim, and what it does with bad requests."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import ipaddress
import json
import socket
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import CONTENT_TYPE_LATEST

from shim.bootstrap import Shim
from shim.compat.fakekubelet import FakeKubelet
from shim.ops.http import MAX_CONNECTIONS, MAX_HEAD_BYTES, OpsServer, OpsThread
from tests.support.scrape import Samples, ops_for, raw, request, started
from tests.support.shim_fixtures import running_shim

NAME = "example.com/ops-http"


@pytest.fixture
async def shim(plugin_dir: Path) -> AsyncIterator[Shim]:
    """A devshim serving one static resource, no kubelet (tests start one when they need it)."""
    async with running_shim(plugin_dir, {NAME: {"count": 2}}, register_backoff_max_s=0.2) as (shim, _):
        yield shim


@pytest.fixture
async def ops(shim: Shim) -> AsyncIterator[OpsServer]:
    async with ops_for(shim) as server:
        yield server


async def test_readyz_is_503_naming_the_resource_until_the_kubelet_registers_it(
    plugin_dir: Path, shim: Shim, ops: OpsServer
) -> None:
    """Not ready while no kubelet has the resource (the reason names it); 200 once registered."""
    waiting = await request(ops.port, "/readyz")
    async with FakeKubelet(plugin_dir) as kubelet:
        await kubelet.wait_for_registration(NAME)
        # The kubelet records the Register as it answers; devshim counts it once the answer is back.
        async with asyncio.timeout(10):
            while not shim.ready()[0]:
                await asyncio.sleep(0.01)
        ready = await request(ops.port, "/readyz")
    assert (waiting.status, waiting.body.decode()) == (503, f"not registered: {NAME}\n")
    assert (ready.status, ready.body.decode()) == (200, "every resource is registered\n")


async def test_healthz_status_and_metrics_answer_with_their_content_types(ops: OpsServer) -> None:
    """/healthz says ok, /status is the shim's status as JSON, /metrics is Prometheus text."""
    health = await request(ops.port, "/healthz")
    status = await request(ops.port, "/status")
    metrics = await request(ops.port, "/metrics?debug=1")  # a query string is ignored
    assert (health.status, health.body) == (200, b"ok\n")
    assert status.status == 200 and status.headers["content-type"] == "application/json"
    assert json.loads(status.body)["resources"][NAME]["devices"] == {"Healthy": 2, "Unhealthy": 0}
    assert metrics.headers["content-type"] == CONTENT_TYPE_LATEST
    assert Samples(metrics.body.decode()).get("devshim_devices", resource=NAME, health="Healthy") == 2
    for reply in (health, status, metrics):
        assert reply.headers["connection"] == "close"
        assert int(reply.headers["content-length"]) == len(reply.body)


async def test_head_gets_the_headers_without_the_body(ops: OpsServer) -> None:
    """HEAD answers like GET, Content-Length included, and sends no body."""
    answer = await raw(ops.port, b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"Content-Length: 3\r\n" in answer
    assert answer.endswith(b"\r\n\r\n")


async def test_unknown_paths_are_404_and_other_methods_405(ops: OpsServer) -> None:
    """Only the four paths exist, and only GET and HEAD are allowed on them."""
    missing = await request(ops.port, "/nope")
    posted = await request(ops.port, "/metrics", method="POST")
    assert missing.status == 404
    assert posted.status == 405 and posted.headers["allow"] == "GET, HEAD"


@pytest.mark.parametrize(
    ("data", "status"),
    [
        pytest.param(b"\x00\xff\x13garbage\r\n\r\n", b"400", id="garbage"),
        pytest.param(b"GET\r\n\r\n", b"400", id="no-path"),
        pytest.param(b"GET /healthz SPDY/3\r\n\r\n", b"400", id="not-http"),
        pytest.param(
            b"GET /healthz HTTP/1.1\r\nX: " + b"a" * MAX_HEAD_BYTES + b"\r\n\r\n", b"431", id="huge"
        ),
    ],
)
async def test_a_malformed_request_gets_an_error_and_the_server_answers_on(
    ops: OpsServer, data: bytes, status: bytes
) -> None:
    """A bad request line or an oversized head is refused with its status; the next request,
    and one from a client that hung up at once, change nothing."""
    answer = await raw(ops.port, data)
    assert answer.startswith(b"HTTP/1.1 " + status + b" ")
    _, writer = await asyncio.open_connection("127.0.0.1", ops.port)
    writer.close()
    assert (await request(ops.port, "/healthz")).status == 200


async def test_stop_does_not_wait_for_a_client_that_never_sends(shim: Shim) -> None:
    """A silent open connection cannot hold up devshim's shutdown."""
    server = OpsServer("127.0.0.1", 0, ready=shim.ready, status=shim.status)
    await server.start()
    port = server.port
    assert port != 0
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    await asyncio.sleep(0.05)
    async with asyncio.timeout(2):
        await server.stop()
    writer.close()
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", port)


def _this_hosts_other_address() -> str | None:
    """An address of this machine that is not loopback (the route out; no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if ipaddress.ip_address(address).is_loopback else address


@pytest.fixture
async def threaded(shim: Shim) -> AsyncIterator[OpsThread]:
    """The ops server as `devshim run` runs it: on its own thread, on every interface."""
    async with started(OpsThread(OpsServer("0.0.0.0", 0, ready=shim.ready, status=shim.status))) as server:
        yield server


async def test_status_answers_only_this_host_unless_configured(shim: Shim, threaded: OpsThread) -> None:
    """/status names sockets, pids and errors: a client from another address gets 403 (the probes
    and /metrics still answer it); with status_from_anywhere it gets the status."""
    other = _this_hosts_other_address()
    if other is None:
        pytest.skip("this machine has no address but loopback to come from")
    assert (await request(threaded.port, "/status")).status == 200
    refused = await request(threaded.port, "/status", host=other)
    assert refused.status == 403 and b"status_from_anywhere" in refused.body
    assert (await request(threaded.port, "/metrics", host=other)).status == 200
    assert (await request(threaded.port, "/healthz", host=other)).status == 200
    anywhere = OpsServer("0.0.0.0", 0, ready=shim.ready, status=shim.status, status_from_anywhere=True)
    async with started(OpsThread(anywhere)) as server:
        assert (await request(server.port, "/status", host=other)).status == 200


async def test_idle_connections_cannot_keep_a_probe_out(threaded: OpsThread) -> None:
    """Twice MAX_CONNECTIONS clients connect and send nothing: the server holds MAX_CONNECTIONS,
    drops idle ones for the rest, and the probe that comes after them is answered."""
    writers = []
    for _ in range(2 * MAX_CONNECTIONS):
        writers.append((await asyncio.open_connection("127.0.0.1", threaded.port))[1])
    try:
        assert (await request(threaded.port, "/healthz")).status == 200
    finally:
        for writer in writers:
            writer.close()


async def test_a_full_server_accepts_no_more_until_an_idle_client_is_dropped(shim: Shim) -> None:
    """At max_connections the server accepts nothing (the kernel queues the newcomer); once the
    oldest idle client has sent nothing for IDLE_S it is dropped, and the newcomer is answered."""
    small = OpsServer("127.0.0.1", 0, ready=shim.ready, status=shim.status, max_connections=4)
    async with started(OpsThread(small)) as server:
        idle = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(4)]
        try:
            assert (await request(server.port, "/healthz")).status == 200
            dropped = 0
            for reader, _ in idle:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.05):
                        dropped += await reader.read() == b""
            assert dropped >= 1  # room was made by closing an idle one, not by holding five
        finally:
            for _, writer in idle:
                writer.close()


async def test_a_flood_of_probes_is_held_never_refused_and_reads_the_serving_loop_little(
    plugin_dir: Path,
) -> None:
    """Over the probes' rate (3 here; MAX_CHEAP_PER_S by default) every probe is still answered
    200, and the serving loop is asked far less often than the probes come."""
    reads = 0

    def ready() -> tuple[bool, str]:
        nonlocal reads
        reads += 1
        return True, "ready"

    flooded = OpsServer("127.0.0.1", 0, ready=ready, status=dict, cheap_per_s=3)
    async with started(OpsThread(flooded)) as server:
        replies = await asyncio.gather(*(request(server.port, "/readyz") for _ in range(30)))
    assert [reply.status for reply in replies] == [200] * 30
    assert reads <= 10, reads  # one read per FRESH_S at most, whatever the probes


async def test_costly_requests_over_the_rate_get_429_and_probes_never_do(shim: Shim) -> None:
    """More scrapes in a second than the limit (3 here; MAX_COSTLY_PER_S by default): the rest are
    429 at once; /healthz and /readyz are not counted."""
    limited = OpsServer("127.0.0.1", 0, ready=shim.ready, status=shim.status, costly_per_s=3)
    async with started(OpsThread(limited)) as server:
        replies = await asyncio.gather(*(request(server.port, "/metrics") for _ in range(12)))
        statuses = [reply.status for reply in replies]
        assert 200 in statuses and statuses.count(429) >= 12 - 2 * 3, statuses  # a second may turn over
        assert (await request(server.port, "/healthz")).status == 200
        assert (await request(server.port, "/readyz")).status in (200, 503)


async def test_healthz_fails_while_the_serving_loop_is_stuck(shim: Shim) -> None:
    """The ops thread answers /healthz only once the serving loop does: with that loop blocked
    (a stand-in for a hang) past the wait, the probe gets 500; once it runs again, 200."""
    ops = OpsServer("127.0.0.1", 0, ready=shim.ready, status=shim.status)
    async with started(OpsThread(ops, serving_wait_s=0.2)) as server:
        replies: list[int] = []
        probe = threading.Thread(target=lambda: replies.append(_get_status(server.port, "/healthz")))
        probe.start()
        time.sleep(2.0)  # the serving loop (this one) blocked on purpose, well past the 0.2 s wait
        await asyncio.to_thread(probe.join)
        assert replies == [500]
        assert (await request(server.port, "/healthz")).status == 200


def _get_status(port: int, path: str) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path)
        return connection.getresponse().status
    finally:
        connection.close()
