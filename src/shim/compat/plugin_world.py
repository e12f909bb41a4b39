"""One cell's world for a device plugin: a fresh fake kubelet and a fresh plugin process.

`devshim compat --plugin CMD` starts the plugin itself, once per cell, in a temp device-plugins
directory: CMD's `{dir}` names it, and a plugin that hard-codes /var/lib/kubelet/device-plugins
runs in a private mount namespace with the temp directory bound over that path (root only). The
socket inode is shared, so the fake kubelet outside the namespace and the plugin inside meet.
`--socket PATH` checks a plugin someone else started: devshim then only dials it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from shim.compat.fakekubelet import FakeKubelet, PluginOptions, PluginSession
from shim.compat.fakekubelet.api import PluginClient
from shim.compat.fakekubelet.records import RegisterRequest, RegistrationRecord
from shim.compat.fakekubelet.versions import WIRES
from shim.facts import REGISTER_TIMEOUT_S

from .driver_world import run_health_hook
from .plugin_process import in_namespace, kill_plugin, start_plugin, stop_plugin, until_ready
from .results import Failed, Skip

PLACEHOLDER = "{dir}"
VERSION = "v1beta1"
# The kubelet's own dial and RPC deadlines (client.go dial: 10 s).
DIAL_TIMEOUT_S = 10.0
RPC_TIMEOUT_S = 10.0
# How long the probe taken as Register arrives waits for the plugin's socket to answer gRPC.
PROBE_TIMEOUT_S = 0.5
NOT_STARTED = "--socket: devshim did not start the plugin, so it cannot watch it register"
NO_HOOK = "no --health-hook given: compat cannot make the plugin change its devices"


@dataclass(frozen=True)
class PluginUnderTest:
    """What `devshim compat` was given: a command to start (`{dir}`: the device-plugins
    directory) or the socket of a plugin already running, and the command that makes the plugin
    change its devices (``--health-hook``), if any."""

    command: str | None = None
    socket: Path | None = None
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    change_hook: str | None = None

    def __post_init__(self) -> None:
        if (self.command is None) == (self.socket is None):
            raise ValueError("give exactly one of a plugin command and --socket")

    @property
    def hardcodes_dir(self) -> bool:
        """Without `{dir}` the plugin is taken to use /var/lib/kubelet/device-plugins."""
        return self.command is not None and PLACEHOLDER not in self.command

    def argv(self, plugin_dir: Path) -> list[str]:
        assert self.command is not None
        return [arg.replace(PLACEHOLDER, str(plugin_dir)) for arg in shlex.split(self.command)]


@dataclass(frozen=True)
class Arrival:
    """A Register call as it arrived; `not_serving` says what the plugin's socket did just then
    (None: it answered gRPC)."""

    resource: str
    socket: Path
    received_at: float
    not_serving: str | None


class ProbingKubelet(FakeKubelet):
    """The fake kubelet, also noting whether the plugin's socket served when each Register arrived.

    Only this instant tells "serves, then registers" from the reverse: the kubelet's own dial
    (1.25+, inside Register) retries for 10 s and 1.24 dials only after Register returns, so a
    plugin that serves a moment late registers fine with both (and fails on a slower node).
    """

    def __init__(self, plugin_dir: Path, *, profile: str) -> None:
        super().__init__(
            plugin_dir,
            profile=profile,
            dial_timeout_s=DIAL_TIMEOUT_S,
            rpc_timeout_s=RPC_TIMEOUT_S,
            on_register=self._probe,
        )
        self.arrivals: list[Arrival] = []

    async def _probe(self, request: RegisterRequest, received_at: float) -> None:
        socket = Path(os.path.normpath(f"{self.plugin_dir}/{request.endpoint}"))  # as connect.py joins
        self.arrivals.append(Arrival(request.resource_name, socket, received_at, await probe(socket)))


async def probe(socket: Path) -> str | None:
    """None when `socket` answers a gRPC call now (any status counts); else what it did."""
    if not socket.exists():
        return "did not exist"
    options = (("grpc.use_local_subchannel_pool", 1),)  # no reconnect backoff shared with the kubelet
    async with grpc.aio.insecure_channel(f"unix:{socket}", options=options) as channel:
        # Raw bytes, no stubs: b"" is an Empty message in every version.
        call = channel.unary_unary(f"/{VERSION}.DevicePlugin/GetDevicePluginOptions", None, None)
        try:
            await call(b"", timeout=PROBE_TIMEOUT_S)
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.UNAVAILABLE:
                return "refused connections"
            if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                # A gRPC server listens from add_insecure_port but answers only once started.
                return f"accepted connections but answered no gRPC call within {PROBE_TIMEOUT_S:g} s"
    return None


@dataclass
class PluginWorld:
    """A started plugin facing a fresh fake kubelet (kubelet and process are None for --socket)."""

    plugin: PluginUnderTest
    profile: str
    kubelet: ProbingKubelet | None
    process: asyncio.subprocess.Process | None = None
    log: Path | None = None
    argv: list[str] = field(default_factory=list)
    _session: PluginSession | None = None
    _clients: list[PluginClient] = field(default_factory=list)

    def started(self) -> ProbingKubelet:
        """The kubelet the plugin registers with; Skip for --socket, where there is none."""
        if self.kubelet is None:
            raise Skip(NOT_STARTED)
        return self.kubelet

    async def first_arrival(self) -> Arrival:
        kubelet = self.started()
        await self.until(lambda: bool(kubelet.arrivals), REGISTER_TIMEOUT_S, "call Register")
        return kubelet.arrivals[0]

    async def resource(self) -> str:
        """The resource of the plugin's first successful registration."""
        kubelet = self.started()
        await self.until(lambda: any(r.ok for r in kubelet.registrations), REGISTER_TIMEOUT_S, "register")
        return str(next(r.resource_name for r in kubelet.registrations if r.ok))

    def registrations(self, resource: str) -> list[RegistrationRecord]:
        return [r for r in self.started().registrations if r.resource_name == resource]

    async def socket(self) -> Path:
        """The plugin's DevicePlugin socket: as given; else the socket of the resource the checks
        use (``resource``: a plugin of several resources serves each on its own socket), or, while
        no Register has succeeded, where the first one pointed."""
        if self.plugin.socket is not None:
            return self.plugin.socket
        first = await self.first_arrival()
        kubelet = self.started()
        chosen = next((r.resource_name for r in kubelet.registrations if r.ok), None)
        return next((a.socket for a in kubelet.arrivals if a.resource == chosen), first.socket)

    async def session(self) -> PluginSession:
        """The kubelet's session with the plugin, its ListAndWatch stream open."""
        if self.kubelet is not None:
            resource = await self.resource()
            try:
                return await self.kubelet.wait_for_plugin(resource, timeout=DIAL_TIMEOUT_S)
            except TimeoutError:
                # A 1.24 kubelet dials after Register answered and only logs a failed dial.
                failed = [f for f in self.kubelet.connect_failures if f.startswith(f"{resource}:")]
                why = f": {failed[-1]}" if failed else ""
                raise Failed(f"{resource} registered, but the kubelet could not connect to it{why}") from None
        if self._session is None:
            self._session = await self.connect()
            self._session.start()
        return self._session

    async def client(self) -> PluginClient:
        """A connection of our own to the plugin's socket, dialled as the kubelet dials."""
        socket = await self.socket()
        # A plugin may register a moment before it serves (serves_before_register reports that);
        # like the kubelet's dial, give its socket the dial timeout to appear.
        await self.until(socket.exists, DIAL_TIMEOUT_S, f"create its socket {socket.name}")
        client = WIRES[VERSION].client(socket)
        self._clients.append(client)
        try:
            async with asyncio.timeout(DIAL_TIMEOUT_S):
                await client.connect()
        except TimeoutError:
            raise Failed(
                f"could not connect to its socket {socket.name} within {DIAL_TIMEOUT_S:g} s"
            ) from None
        return client

    async def connect(self) -> PluginSession:
        """A kubelet-side session over a connection of our own (its stream not opened)."""
        name = (await self.socket()).name
        client = await self.client()
        return PluginSession(
            name, name, PluginOptions(), client, version=VERSION, rpc_timeout_s=RPC_TIMEOUT_S
        )

    async def crash_and_start(self) -> None:
        """SIGKILL the plugin and all it started, as a crash or an OOM kill ends it (nothing
        cleaned up, its socket file left), and start it again at once; Skip for --socket."""
        if self.process is None or self.log is None:
            raise Skip(NOT_STARTED)
        await kill_plugin(self.process)
        self.process = await start_plugin(self.argv, self.plugin.env, self.log, append=True)

    async def stop(self) -> None:
        if self.process is not None:
            await stop_plugin(self.process)

    async def change(self, resource: str, device: str) -> None:
        """The plugin made to change ``device`` (--health-hook, told the plugin's pid as
        DEVSHIM_COMPAT_PLUGIN_PID); Skip without a hook or a process."""
        if self.plugin.change_hook is None:
            raise Skip(NO_HOOK)
        if self.process is None:
            raise Skip(NOT_STARTED)
        env = {**self.plugin.env, "DEVSHIM_COMPAT_PLUGIN_PID": str(self.process.pid)}
        await run_health_hook(self.plugin.change_hook, env, resource, device, self.process.pid)

    def log_tail(self, lines: int = 5) -> str:
        if self.log is None or not self.log.exists():
            return ""
        tail = self.log.read_bytes()[-2000:].decode(errors="replace").strip().splitlines()[-lines:]
        return f"; the plugin's log ends: {' | '.join(tail)}" if tail else "; the plugin logged nothing"

    async def until(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        """Until `ready()`, failing early when the plugin process exits."""
        await until_ready(ready, self.process, timeout, what, self.log_tail, self._rejections)

    def _rejections(self) -> str:
        errors = [r.error for r in (self.kubelet.registrations if self.kubelet else []) if not r.ok]
        return f"; the kubelet rejected Register: {errors[-1]}" if errors else ""

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()  # its stream first, then its client
        for client in self._clients:
            await client.close()


@asynccontextmanager
async def plugin_world(plugin: PluginUnderTest, profile: str) -> AsyncIterator[PluginWorld]:
    """A fresh world for one cell; the plugin process is stopped at the end, always."""
    if plugin.socket is not None:
        world = PluginWorld(plugin, profile, None)
        try:
            yield world
        finally:
            await world.close()
        return
    root = Path(tempfile.mkdtemp(prefix="ds-compat-", dir="/tmp"))  # sockets need paths < 108 bytes
    # The log lives beside, not in, the device-plugins directory: kubelet cleanups empty that.
    plugin_dir, log = root / "dp", root / "plugin.log"
    plugin_dir.mkdir()
    kubelet = ProbingKubelet(plugin_dir, profile=profile)
    world = PluginWorld(plugin, profile, kubelet, log=log)
    try:
        async with contextlib.AsyncExitStack() as stack:
            argv = plugin.argv(plugin_dir)
            if plugin.hardcodes_dir:
                argv = await stack.enter_async_context(in_namespace(plugin_dir, argv))
            await stack.enter_async_context(kubelet)
            world.argv = argv
            world.process = await start_plugin(argv, plugin.env, log)
            stack.push_async_callback(world.stop)  # whichever process runs by then
            stack.push_async_callback(world.close)
            yield world
    finally:
        shutil.rmtree(root, ignore_errors=True)
