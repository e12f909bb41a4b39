"""One cell's world for a driver: a fake kubelet, devshim in front of the driver, in a temp dir.

Every cell gets a fresh world (directories, kubelet, devshim, driver process), so a scenario's
outcome never depends on another's. devshim offers v1beta1 and v1beta2 and uses the registration
path of the cell's mode; the fake kubelet behaves like the mode's profile. Nothing outside the
temp directory is touched and no root is needed.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shim.bootstrap import Shim
from shim.compat.fakekubelet import FakeKubelet, PluginSession
from shim.compat.fakekubelet.records import DeviceState
from shim.driverhost import DriverHost
from shim.facts import KUBELET_SOCKET
from shim.model import Capabilities
from shim.policy import RULES, GrantPolicy, Suggestion
from shim.settings import Settings

from .modes import Kubelet, Mode
from .results import Failed

DRIVER_NAME = "my-driver"
CDI_FOLDER = "cdi"  # in the cell's folder: the specs the driver ships, as devshim writes them
# How long a driver may take from its start to every resource's first list reaching the kubelet.
START_TIMEOUT_S = 30.0
# The deallocate emulation's grace (devshim's default is 30 s); short so cells stay quick.
DEALLOCATE_GRACE_S = 0.3
HOOK_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class DriverUnderTest:
    """What `devshim compat --driver` was given. By default the driver runs as `devshim run`
    would run it: with exactly ``env`` as its environment and its grants held to the policy in
    ``entry`` (its drivers[] entry from --config: policy, resource_policies, timeouts, ...; empty:
    the defaults). ``relaxed``: any grant, and the caller's environment under ``env``."""

    command: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    entry: Mapping[str, Any] = field(default_factory=dict)
    relaxed: bool = False
    # A shell command that makes the driver report DEVSHIM_COMPAT_DEVICE of DEVSHIM_COMPAT_RESOURCE
    # Unhealthy (its pid is DEVSHIM_COMPAT_DRIVER_PID); without it the health row is skipped.
    health_hook: str | None = None
    # What every Allocate answer must contain, "[RESOURCE:]KIND=VALUE" (driver_scenarios.expectation).
    expect: Sequence[str] = ()
    # How long the health_watch row waits for a health change the driver makes on its own.
    health_watch_s: float = 0.0
    # CDI spec folders on the node (--cdi-dir): where the vendor installs the specs the CDI names
    # it grants resolve in, besides those it ships (written to the cell's own folder).
    cdi_dirs: Sequence[Path] = ()
    # What its grants needed, noted as devshim judges them: the declaration compat suggests.
    suggestion: Suggestion = field(default_factory=Suggestion, compare=False)

    @property
    def declared(self) -> bool:
        """Whether --config declared the driver (its resources and policy), or compat learns them."""
        return self.entry.get("resources") is not None

    def describe(self) -> str:
        """How the driver is run, for the report's header."""
        if self.relaxed:
            return "relaxed (--relaxed): any grant allowed; the driver gets this shell's environment"
        keys = ", ".join(sorted(self.env)) or "none: no PATH either"
        policy = (
            f"drivers[{self.entry['name']}]'s resources and grant policy"
            if self.declared
            else "no --config declaring it: it serves what it declares, any grant above the floor is "
            "allowed, and the declaration it needs is printed at the end"
        )
        user = self.entry.get("user")
        who = f"user {user}" if user is not None else "devshim's default user (nobody, when root)"
        return f"as `devshim run` runs it: {policy}; environment variables {keys}; as {who}"

    def policies(self, policy: GrantPolicy) -> GrantPolicy:
        """The Shim's policy seam: every grant noted; the allowlists held only where declared."""
        return policy.watched(self.suggestion, declared=self.declared and not self.relaxed)


@dataclass
class DevshimSide:
    """devshim in front of the driver under test, as every judge's world holds it."""

    shim: Shim
    driver: DriverUnderTest
    root: Path
    settings: Settings | None = field(default=None, kw_only=True)
    running: AsyncExitStack = field(default_factory=AsyncExitStack, kw_only=True)  # the devshim now

    async def restart_devshim(self) -> None:
        """devshim stopped as SIGTERM stops it (an upgrade: drivers stopped, sockets removed,
        the state folder kept) and started again with the same settings."""
        assert self.settings is not None
        await self.running.aclose()
        self.running = AsyncExitStack()
        self.shim = await self.running.enter_async_context(Shim(self.settings, policies=self.driver.policies))

    @property
    def host(self) -> DriverHost:
        return self.shim.drivers[0]

    @property
    def resources(self) -> list[str]:
        return sorted(self.host.sources)

    def capabilities(self, resource: str) -> Capabilities:
        return self.host.sources[resource].capabilities()

    def driver_pid(self) -> int:
        process = self.host.process
        if process is None:
            raise Failed(f"the driver is not running ({self.host.status})")
        return process.pid

    def calls_ok(self, method: str) -> int:
        tally = self.host.calls.get(method)
        return tally.ok if tally else 0

    async def wait_for_calls(self, method: str, count: int, timeout_s: float = 10.0) -> None:
        """Until devshim has had `count` successful `method` calls answered by the driver."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.calls_ok(method) < count:
            if loop.time() > deadline:
                tally = self.host.calls.get(method)
                error = f"; last error: {tally.last_error}" if tally and tally.last_error else ""
                raise Failed(
                    f"the driver answered {self.calls_ok(method)} {method} calls, not {count}{error}"
                )
            await asyncio.sleep(0.02)

    async def expect_deallocations(self, before: int, pods: int) -> None:
        """Until the driver has answered `pods` deallocate calls since `before`, then that no
        second, wrong one follows within a few emulation graces."""
        await self.wait_for_calls("deallocate", before + pods)
        await asyncio.sleep(DEALLOCATE_GRACE_S * 3)  # a negative check: time for an extra one to show
        extra = self.calls_ok("deallocate") - before
        if extra != pods:
            raise Failed(f"deallocate called {extra} times for {pods} pods")

    async def run_health_hook(self, resource: str, device: str) -> None:
        assert self.driver.health_hook is not None
        await run_health_hook(self.driver.health_hook, self.driver.env, resource, device, self.driver_pid())

    def kill_driver(self) -> None:
        os.kill(self.driver_pid(), signal.SIGKILL)

    async def driver_up(self) -> None:
        """Until the driver runs and has declared at least one resource (a driver such as the
        legacy adapter declares its resources once its plugins have registered)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_TIMEOUT_S
        while self.host.status != "up" or not self.resources:
            if self.host.gave_up.is_set():
                raise Failed(f"the driver did not start: {self.host.status}")
            if self.host.status == "up" and not self.resources and self.host.refused:
                refused = "; ".join(f"{name!r}: {why}" for name, why in self.host.refused.items())
                raise Failed(f"devshim refused every resource the driver declared: {refused}")
            if loop.time() > deadline:
                if self.host.status == "up":
                    raise Failed(f"the driver declared no resources within {START_TIMEOUT_S:g} s")
                raise Failed(f"the driver did not start: {self.host.status}")
            await asyncio.sleep(0.02)


@dataclass
class DriverWorld(DevshimSide):
    """A driver behind devshim, facing the fake kubelet of one mode."""

    mode: Mode
    kubelet: FakeKubelet
    kubelet_now: Kubelet  # the kubelet running now (a restart may change it)

    def session(self, resource: str) -> PluginSession:
        return self.kubelet.plugin(resource)

    def current_session(self, resource: str) -> PluginSession | None:
        """The kubelet's session for `resource` now, None if it has none (torn down, not yet back)."""
        try:
            return self.kubelet.plugin(resource)
        except KeyError:
            return None

    async def registered(self, resource: str, *, count: int = 1) -> PluginSession:
        """The kubelet's session for `resource` after its `count`-th registration, with a list."""
        try:
            record = await self.kubelet.wait_for_registration(resource, count=count, timeout=START_TIMEOUT_S)
        except TimeoutError:
            failed = [r.error for r in self.kubelet.registrations if r.resource_name == resource and not r.ok]
            why = f"; rejected: {failed[-1]}" if failed else ""
            raise Failed(
                f"{resource}: not registered (registration {count}) within {START_TIMEOUT_S:g} s{why}"
            ) from None
        try:
            session = await self.kubelet.wait_for_plugin(resource, timeout=START_TIMEOUT_S)
            await session.wait_for_list(timeout=START_TIMEOUT_S)
        except TimeoutError as err:
            # A <= 1.24 kubelet answers Register OK and dials afterwards: say why that failed.
            failures = "; ".join(self.kubelet.connect_failures)
            raise Failed(
                f"{resource}: registered, but {err}" + (f"; {failures}" if failures else "")
            ) from None
        if record.version != self.kubelet_now.negotiated:
            raise Failed(
                f"{resource}: registered speaking {record.version}, not {self.kubelet_now.negotiated}"
            )
        return session


async def run_health_hook(hook: str, env: Mapping[str, str], resource: str, device: str, pid: int) -> None:
    """The caller's --health-hook, told which device to make Unhealthy; Failed if it fails."""
    env = {
        **os.environ,  # the hook is the caller's command, with what the driver is given
        **env,
        "DEVSHIM_COMPAT_RESOURCE": resource,
        "DEVSHIM_COMPAT_DEVICE": device,
        "DEVSHIM_COMPAT_HEALTH": "Unhealthy",
        "DEVSHIM_COMPAT_DRIVER_PID": str(pid),
    }
    process = await asyncio.create_subprocess_shell(
        hook, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    try:
        async with asyncio.timeout(HOOK_TIMEOUT_S):
            output, _ = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        raise Failed(f"the health hook did not finish within {HOOK_TIMEOUT_S:g} s") from None
    if process.returncode != 0:
        text = output.decode(errors="replace").strip()[-500:]
        raise Failed(f"the health hook exited with {process.returncode}: {text}")


# `devshim compat --relaxed`: judge how a driver speaks the protocol only, not what a node lets it
# grant (the operator's grant policy, docs/configuration.md): the floor lifted too.
ALLOW_ANY_GRANT: dict[str, Any] = {
    "device_node_types": None,
    "allow_world_writable_dirs": True,
    "read_only_mounts": False,
    "unsafe": dict.fromkeys(RULES, True),
}
# A driver compat runs as a `devshim run` process with no --config declaring it (the DRA judge):
# every grant above the floor.
ABOVE_THE_FLOOR: dict[str, Any] = {
    "envs": ["*"],
    "device_nodes": ["/**"],
    "device_node_types": ["char", "block"],
    "mounts": ["/**"],
    "read_only_mounts": False,
    "cdi_kinds": ["*"],
}


def settings_entry(driver: DriverUnderTest, name: str) -> dict[str, Any]:
    """The driver's drivers[] entry in devshim's settings, as `devshim run` would run it."""
    # --relaxed runs the driver as this shell's user too: as root, root, not nobody.
    as_caller = {"user": "root"} if driver.relaxed and os.geteuid() == 0 else {}
    return {
        "name": name,
        **as_caller,
        **driver.entry,
        "command": list(driver.command),
        "env": {**os.environ, **driver.env} if driver.relaxed else dict(driver.env),
        **({"policy": ALLOW_ANY_GRANT, "resource_policies": {}} if driver.relaxed else {}),
    }


def process_entry(driver: DriverUnderTest, name: str, resources: list[str]) -> dict[str, Any]:
    """The entry for a `devshim run` process (no policy seam there): the driver's resources as it
    declared them, and every grant above the floor, unless --config declared it."""
    entry = settings_entry(driver, name)
    if driver.declared:
        return entry
    policy = ALLOW_ANY_GRANT if driver.relaxed else ABOVE_THE_FLOOR
    return {**entry, "resources": resources, "policy": policy, "resource_policies": {}}


def settings_for(
    driver: DriverUnderTest, registration: str, root: Path, restart_backoff_s: float = 0.05
) -> Settings:
    return Settings.load(
        discover_resources=not driver.declared,
        device_plugins_dir=root / "device-plugins",
        plugins_registry_dir=root / "plugins_registry",
        state_dir=root / "state",
        cdi_dir=root / CDI_FOLDER,
        register_backoff_max_s=0.5,
        api_versions=["v1beta1", "v1beta2"],
        registration=registration,
        drivers=[
            {
                **settings_entry(driver, DRIVER_NAME),
                # Restart a crashed driver at once (the crash row times its recovery).
                "restart": {"backoff_initial_s": restart_backoff_s, "backoff_max_s": 1.0},
            }
        ],
        deallocation={
            "pod_resources_socket": str(root / "pod-resources" / KUBELET_SOCKET),
            "poll_interval_s": 0.05,
            "grace_s": DEALLOCATE_GRACE_S,
        },
    )


@asynccontextmanager
async def driver_world(
    driver: DriverUnderTest, mode: Mode, kubelet: Kubelet | None = None
) -> AsyncIterator[DriverWorld]:
    """A running world whose every resource has registered and sent a first list.

    `kubelet`: start with this kubelet instead of the mode's (a downgrade starts one step up).
    """
    first = kubelet or mode.kubelet
    # Short: socket paths must fit in 108 bytes.
    root = Path(tempfile.mkdtemp(prefix="ds-compat-", dir="/tmp"))
    settings = settings_for(driver, mode.registration, root)
    (root / "pod-resources").mkdir()
    fake = FakeKubelet(
        settings.device_plugins_dir,
        profile=first.profile,
        versions=first.versions,
        pod_resources_socket=root / "pod-resources" / KUBELET_SOCKET,
        plugins_registry=settings.plugins_registry_dir if mode.registration == "watcher" else None,
    )
    try:
        async with fake:
            running = AsyncExitStack()
            shim = await running.enter_async_context(Shim(settings, policies=driver.policies))
            world = DriverWorld(shim, driver, root, mode, fake, first, settings=settings, running=running)
            try:
                await _started(world)
                yield world
            finally:
                await world.running.aclose()  # whichever devshim runs by then
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def declared_resources(driver: DriverUnderTest) -> list[str]:
    """The resources ``driver`` declares when devshim starts it as `run` would, facing no
    kubelet: what a DRA pool of the driver's devices must name before devshim starts
    (`devshim compat --dra --driver`)."""
    root = Path(tempfile.mkdtemp(prefix="ds-probe-", dir="/tmp"))
    try:
        async with Shim(settings_for(driver, "classic", root), policies=driver.policies) as shim:
            side = DevshimSide(shim, driver, root)
            await side.driver_up()
            return side.resources
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def _started(world: DriverWorld) -> None:
    await world.driver_up()
    world.driver.suggestion.resources.update(world.resources)
    for resource in world.resources:
        await world.registered(resource)


async def restart_kubelet(world: DriverWorld, kubelet: Kubelet) -> None:
    """Restart the fake kubelet as `kubelet` (its profile's cleanup of device-plugins/)."""
    await world.kubelet.restart(profile=kubelet.profile, versions=kubelet.versions)
    world.kubelet_now = kubelet


def ids(devices: Sequence[DeviceState]) -> list[str]:
    return [d.id for d in devices]
