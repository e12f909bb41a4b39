"""TEST DOUBLE: a scripted DRA kubelet plugin, run as its own process, to test the DRA manager
harness (shim.compat.upstream.dra_manager) without devshim.

    python -m tests.support.dra_plugin --driver gpu.example.com --node node-a \\
        --registry DIR --socket PATH --cdi-dir DIR --record FILE --script JSON [--kubeconfig FILE]

It serves pluginregistration.Registration on `<registry>/<driver>-reg.sock` (GetInfo: type
"DRAPlugin", name the driver, endpoint its --socket, supported_versions from the script), and on
--socket the DRAPlugin services of k8s.io.kubelet.pkg.apis.dra v1 and v1beta1 that the script
says it serves, and with a scripted `health` the DRAResourceHealth services v1 and v1alpha1 (whether or
not it lists them: 1.34 calls v1alpha1 unasked). NodePrepareResources answers each claim with
one device (pool: the node's name; device and request names: the script's) whose CDI ID
`<driver>/claim=<claim UID>` it writes a CDI spec for in --cdi-dir: env FOO=<claim UID> and
DEVSHIM_TEST_DEVICE=<device>, a device node /dev/devshim-test-<device> made from /dev/null, and a
read-only bind mount of the CDI dir at /run/devshim-test. NodeUnprepareResources removes the
spec. Every call is appended to --record as one JSON line: {"service": "v1.DRAPlugin", "method":
"NodePrepareResources", "claims": [...]}; {"event": "serving"} once both sockets serve. With
--kubeconfig it first publishes one ResourceSlice for its node (pool: the node's name, one
generation and slice, the script's device) in the newest resource.k8s.io version the API server
serves, as a DRA driver does for `devshim compat --dra --dra-plugin`. It runs as a script too
(python tests/support/dra_plugin.py ...): it imports nothing of tests/.

The script (JSON): versions (the supported versions it registers with; default ["v1.DRAPlugin",
"v1beta1.DRAPlugin"]), serves (the DRAPlugin services it really serves; default: versions, so
{"versions": ["v1.DRAPlugin"], "serves": ["v1beta1.DRAPlugin"]} is a plugin that advertises v1
but serves only v1beta1), device ("gpu-0"),
requests (["gpu"]), health (none; "HEALTHY", "UNHEALTHY" or "UNKNOWN": the device's health sent
once on every NodeWatchResources stream, which then stays open), prepare_error (none; the
per-claim error NodePrepareResources answers instead).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import yaml

from shim.compat.realnode.apiserver import APIError, https_request
from shim.compat.realnode.certs import KeyPair
from shim.compat.realnode.controlplane import version_priority
from shim.generated.dra.v1 import api_pb2 as dra_v1
from shim.generated.dra.v1 import api_pb2_grpc as dra_v1_grpc
from shim.generated.dra.v1beta1 import api_pb2 as dra_v1beta1
from shim.generated.dra.v1beta1 import api_pb2_grpc as dra_v1beta1_grpc
from shim.generated.drahealth.v1 import api_pb2 as health_v1
from shim.generated.drahealth.v1 import api_pb2_grpc as health_v1_grpc
from shim.generated.drahealth.v1alpha1 import api_pb2 as health_v1alpha1
from shim.generated.drahealth.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from shim.generated.pluginregistration.v1 import api_pb2 as reg_pb
from shim.generated.pluginregistration.v1 import api_pb2_grpc as reg_grpc

REPO = Path(__file__).resolve().parents[2]
DEFAULT_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
# The DRAPlugin services it can serve: (service name as advertised, message module, grpc module).
PLUGIN_SERVICES: dict[str, tuple[ModuleType, ModuleType]] = {
    "v1.DRAPlugin": (dra_v1, dra_v1_grpc),
    "v1beta1.DRAPlugin": (dra_v1beta1, dra_v1beta1_grpc),
}
HEALTH_SERVICES: dict[str, tuple[ModuleType, ModuleType]] = {
    "v1.DRAResourceHealth": (health_v1, health_v1_grpc),
    "v1alpha1.DRAResourceHealth": (health_v1alpha1, health_v1alpha1_grpc),
}
CDI_VERSION = "0.6.0"
CONTAINER_MOUNT = "/run/devshim-test"
START_TIMEOUT_S = 30.0
Calls = list[dict[str, Any]]


def cdi_id(driver: str, claim_uid: str) -> str:
    """The CDI device ID the plugin hands the kubelet for a claim."""
    return f"{driver}/claim={claim_uid}"


# -- the plugin process ------------------------------------------------------------------------


class _Plugin:
    def __init__(self, args: argparse.Namespace, script: dict[str, Any]) -> None:
        self.driver: str = args.driver
        self.node: str = args.node
        self.socket = Path(args.socket)
        self.cdi_dir = Path(args.cdi_dir)
        self.record_file = Path(args.record)
        self.versions: list[str] = list(script.get("versions", DEFAULT_VERSIONS))
        self.serves: list[str] = list(script.get("serves", self.versions))
        self.device: str = script.get("device", "gpu-0")
        self.requests: list[str] = list(script.get("requests", ["gpu"]))
        self.health: str | None = script.get("health")
        self.prepare_error: str = script.get("prepare_error", "")

    def record(self, entry: dict[str, Any]) -> None:
        with self.record_file.open("a") as f:
            f.write(json.dumps(entry) + "\n")

    def spec_path(self, claim_uid: str) -> Path:
        return self.cdi_dir / f"{self.driver}-{claim_uid}.json"

    def write_spec(self, claim_uid: str) -> None:
        spec = {
            "cdiVersion": CDI_VERSION,
            "kind": f"{self.driver}/claim",
            "devices": [{
                "name": claim_uid,
                "containerEdits": {
                    "env": [f"FOO={claim_uid}", f"DEVSHIM_TEST_DEVICE={self.device}"],
                    "deviceNodes": [{"path": f"/dev/devshim-test-{self.device}", "hostPath": "/dev/null"}],
                    "mounts": [{"hostPath": str(self.cdi_dir), "containerPath": CONTAINER_MOUNT,
                                "options": ["ro", "bind"]}],
                },
            }],
        }  # fmt: skip
        partial = self.spec_path(claim_uid).with_suffix(".tmp")
        partial.write_text(json.dumps(spec))
        partial.rename(self.spec_path(claim_uid))


def _claims(request: Any) -> dict[str, list[dict[str, str]]]:
    return {"claims": [{"uid": c.uid, "name": c.name, "namespace": c.namespace} for c in request.claims]}


class _DRAServicer:
    """One version's DRAPlugin service; gRPC finds the methods by name."""

    def __init__(self, plugin: _Plugin, service: str, pb: ModuleType) -> None:
        self._plugin, self._service, self._pb = plugin, service, pb

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        plugin, pb = self._plugin, self._pb
        plugin.record({"service": self._service, "method": "NodePrepareResources", **_claims(request)})
        response = pb.NodePrepareResourcesResponse()
        for claim in request.claims:
            if plugin.prepare_error:
                response.claims[claim.uid].error = plugin.prepare_error
                continue
            plugin.write_spec(claim.uid)
            device = pb.Device(
                request_names=plugin.requests,
                pool_name=plugin.node,
                device_name=plugin.device,
                cdi_device_ids=[cdi_id(plugin.driver, claim.uid)],
            )
            response.claims[claim.uid].devices.append(device)
        return response

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        plugin, pb = self._plugin, self._pb
        plugin.record({"service": self._service, "method": "NodeUnprepareResources", **_claims(request)})
        response = pb.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            plugin.spec_path(claim.uid).unlink(missing_ok=True)
            response.claims[claim.uid].error = ""
        return response


class _HealthServicer:
    def __init__(self, plugin: _Plugin, service: str, pb: ModuleType) -> None:
        self._plugin, self._service, self._pb = plugin, service, pb

    async def NodeWatchResources(self, request: Any, context: Any) -> AsyncIterator[Any]:
        plugin, pb = self._plugin, self._pb
        plugin.record({"service": self._service, "method": "NodeWatchResources"})
        device = pb.DeviceHealth(
            device=pb.DeviceIdentifier(pool_name=plugin.node, device_name=plugin.device),
            health=pb.HealthStatus.Value(plugin.health or "UNKNOWN"),
            last_updated_time=int(time.time()),
        )
        yield pb.NodeWatchResourcesResponse(devices=[device])
        await asyncio.Event().wait()  # the stream stays open until the kubelet ends it


class _RegistrationServicer(reg_grpc.RegistrationServicer):
    def __init__(self, plugin: _Plugin) -> None:
        self._plugin = plugin

    async def GetInfo(self, request: Any, context: Any) -> Any:
        plugin = self._plugin
        plugin.record({"service": "pluginregistration", "method": "GetInfo"})
        endpoint = str(plugin.socket)
        return reg_pb.PluginInfo(
            type="DRAPlugin", name=plugin.driver, endpoint=endpoint, supported_versions=plugin.versions
        )

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        self._plugin.record({
            "service": "pluginregistration", "method": "NotifyRegistrationStatus",
            "registered": request.plugin_registered, "error": request.error,
        })  # fmt: skip
        return reg_pb.RegistrationStatusResponse()


def publish(kubeconfig: Path, driver: str, node: str, devices: list[str]) -> None:
    """One complete pool of `devices` for `node`, in the newest resource.k8s.io version served
    (v1beta1 and older nest a device's attributes under `basic`). Already there (a restarted
    plugin) is fine."""
    config = yaml.safe_load(kubeconfig.read_text())
    cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
    client = KeyPair(Path(user["client-certificate"]), Path(user["client-key"]))

    def request(method: str, path: str, body: Any = None) -> Any:
        ca = Path(cluster["certificate-authority"])
        return https_request(cluster["server"] + path, method, ca=ca, client=client, token=None, body=body)

    found = request("GET", "/apis/resource.k8s.io")["versions"]
    version = max((v["version"] for v in found), key=version_priority)
    nested = version in ("v1beta1", "v1alpha3")
    slice_ = {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": d, "basic": {}} if nested else {"name": d} for d in devices],
        },
    }
    try:
        request("POST", f"/apis/resource.k8s.io/{version}/resourceslices", slice_)
    except APIError as err:
        if err.status != 409:
            raise


async def _serve(args: argparse.Namespace) -> None:
    plugin = _Plugin(args, json.loads(args.script))
    registry = Path(args.registry)
    registry.mkdir(parents=True, exist_ok=True)
    plugin.cdi_dir.mkdir(parents=True, exist_ok=True)
    reg_socket = registry / f"{plugin.driver}-reg.sock"
    for path in (plugin.socket, reg_socket):
        path.unlink(missing_ok=True)
    server = grpc.aio.server()
    for service, (pb, pb_grpc) in PLUGIN_SERVICES.items():
        if service in plugin.serves:
            pb_grpc.add_DRAPluginServicer_to_server(_DRAServicer(plugin, service, pb), server)
    if plugin.health is not None:
        for service, (pb, pb_grpc) in HEALTH_SERVICES.items():
            pb_grpc.add_DRAResourceHealthServicer_to_server(_HealthServicer(plugin, service, pb), server)
    server.add_insecure_port(f"unix:{plugin.socket}")
    await server.start()
    if args.kubeconfig:
        await asyncio.to_thread(publish, Path(args.kubeconfig), plugin.driver, plugin.node, [plugin.device])
    # The registration socket last: the plugin manager finds the plugin only once it serves.
    registration = grpc.aio.server()
    reg_grpc.add_RegistrationServicer_to_server(_RegistrationServicer(plugin), registration)  # type: ignore[no-untyped-call]
    registration.add_insecure_port(f"unix:{reg_socket}")
    await registration.start()
    plugin.record({"event": "serving"})
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    await stopping.wait()
    # Its registration socket removed first, as a plugin going away does: the plugin manager
    # then deregisters it.
    reg_socket.unlink(missing_ok=True)
    await registration.stop(0)
    await server.stop(0)
    plugin.socket.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="dra_plugin", description=__doc__.split("\n\n")[0])
    parser.add_argument("--driver", required=True)
    parser.add_argument("--node", required=True, help="the node's name: the pool of its devices")
    parser.add_argument("--registry", required=True, help="the kubelet's plugins_registry directory")
    parser.add_argument("--socket", required=True, help="the DRA service socket (its endpoint)")
    parser.add_argument("--cdi-dir", required=True)
    parser.add_argument("--record", required=True, help="a file each call is appended to")
    parser.add_argument("--script", default="{}", help="the script, as JSON")
    parser.add_argument("--kubeconfig", help="publish a ResourceSlice of the device to this API server")
    asyncio.run(_serve(parser.parse_args(argv)))


# -- the test's side ---------------------------------------------------------------------------


@dataclass
class DraPlugin:
    """A running scripted plugin: where it serves, and what it recorded."""

    driver: str
    socket: Path
    cdi_dir: Path
    record_file: Path
    log: Path
    process: asyncio.subprocess.Process

    def calls(self) -> Calls:
        """Every recorded call, in order."""
        try:
            lines = self.record_file.read_text().splitlines()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in lines if line.strip()]

    def methods(self, method: str) -> Calls:
        return [c for c in self.calls() if c.get("method") == method]

    def spec(self, claim_uid: str) -> Path:
        return self.cdi_dir / f"{self.driver}-{claim_uid}.json"

    async def until(self, holds: Callable[[Calls], bool], what: str, timeout: float = 30) -> None:
        """Return once `holds(calls)`; AssertionError naming `what` and the calls after `timeout`."""
        try:
            async with asyncio.timeout(timeout):
                while not holds(self.calls()):
                    if (code := self.process.returncode) is not None:
                        raise AssertionError(f"the plugin exited ({code}): {self.log_tail()}")
                    await asyncio.sleep(0.02)
        except TimeoutError:
            raise AssertionError(
                f"timed out waiting until {what}; the plugin's calls: {self.calls()}"
            ) from None

    def log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-3000:]
        except OSError:
            return ""


@asynccontextmanager
async def running_dra_plugin(
    folder: Path, driver: str, node: str, registry: Path, script: dict[str, Any] | None = None
) -> AsyncIterator[DraPlugin]:
    """The scripted plugin of `driver` on `node`, serving `script` from `folder` (its socket,
    CDI dir, record and log there) and registering in `registry`; once it serves. SIGTERM on the
    way out (it removes its registration socket first), SIGKILL if it does not end."""
    folder.mkdir(parents=True, exist_ok=True)
    socket, cdi_dir = folder / "dra.sock", folder / "cdi"
    record, log = folder / "plugin.jsonl", folder / "plugin.log"
    record.unlink(missing_ok=True)
    argv = [
        sys.executable, "-m", "tests.support.dra_plugin", "--driver", driver, "--node", node,
        "--registry", str(registry), "--socket", str(socket), "--cdi-dir", str(cdi_dir),
        "--record", str(record), "--script", json.dumps(script or {}),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    with log.open("ab") as out:
        process = await asyncio.create_subprocess_exec(
            *argv, cwd=REPO, env=env, stdout=out, stderr=out, start_new_session=True
        )
    plugin = DraPlugin(driver, socket, cdi_dir, record, log, process)
    try:
        await plugin.until(lambda calls: {"event": "serving"} in calls, "the plugin serves", START_TIMEOUT_S)
        yield plugin
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                async with asyncio.timeout(10):
                    await process.wait()
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()


if __name__ == "__main__":
    main()
