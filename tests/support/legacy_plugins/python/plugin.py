"""A vendor-style legacy v1beta1 device plugin, sharing no code with devshim.

Its stubs are generated from its own api.proto (the test does that into a temp dir
on PYTHONPATH). It serves its own socket, calls Register itself, and runs its own
ListAndWatch loop, like plugins written against the kubelet API directly.
Flags come from the environment: DP_DIR (default /var/lib/kubelet/device-plugins),
PY_RESOURCE, PY_DEVICES (comma-separated), PY_REGISTER_FIRST=1 (the common bug of
calling Register a second before serving), PY_REREGISTER=1 (Register again whenever
kubelet.sock is made anew, a kubelet restart, keeping the same server). SIGUSR1 flips the
last device's health; SIGUSR2 exits with code 3 (a crash).

PY_BUG adds one deliberate bug, for `devshim compat --plugin` to find:
return-from-listandwatch (one list, then the stream ends), lowercase-health ("healthy"),
empty-allocate (no ContainerAllocateResponse), oversized-list (a first list over 4 MiB),
socket-per-second (its socket named after the second it started in and never removed, and a
stale one at that name fatal, as Go's net.Listen makes it: a restart within the same second
cannot serve; a public plugin had exactly this), leaked-list-loop (each ListAndWatch takes
changes off one shared queue through a loop of its own that outlives its stream: after the
kubelet drops a stream, that loop takes the next change, which the new stream never sees;
another public plugin had this).
"""

import time

STARTED = int(time.time())  # before the imports below, which take a good part of a second

import asyncio  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402

import api_pb2  # noqa: E402
import api_pb2_grpc  # noqa: E402
import grpc  # noqa: E402

DIR = os.environ.get("DP_DIR", "/var/lib/kubelet/device-plugins")
RESOURCE = os.environ.get("PY_RESOURCE", "example.com/pyplug")
DEVICES = os.environ.get("PY_DEVICES", "p0,p1,p2").split(",")
BUG = os.environ.get("PY_BUG", "")
BUGS = (
    "",
    "return-from-listandwatch",
    "lowercase-health",
    "empty-allocate",
    "oversized-list",
    "socket-per-second",
    "leaked-list-loop",
)
if BUG not in BUGS:
    sys.exit(f"pyplug: unknown PY_BUG {BUG!r}; known: {', '.join(BUGS[1:])}")
SOCKET = f"pyplug-{STARTED}.sock" if BUG == "socket-per-second" else "pyplug.sock"


class Plugin(api_pb2_grpc.DevicePluginServicer):
    def __init__(self):
        self.health = {d: "Healthy" for d in DEVICES}
        self.changed = asyncio.Event()
        self.changes = asyncio.Queue()  # leaked-list-loop: one token per change, shared
        self.loops = set()

    def flip(self):
        last = DEVICES[-1]
        self.health[last] = "Unhealthy" if self.health[last] == "Healthy" else "Healthy"
        self.changed.set()
        self.changes.put_nowait(None)

    async def GetDevicePluginOptions(self, request, context):
        return api_pb2.DevicePluginOptions(pre_start_required=True, get_preferred_allocation_available=True)

    def devices(self):
        health = str.lower if BUG == "lowercase-health" else str
        devices = [api_pb2.Device(ID=d, health=health(self.health[d])) for d in DEVICES]
        if BUG == "oversized-list":  # 5000 devices with 1 KiB IDs: about 5 MiB
            devices += [api_pb2.Device(ID=f"pad{i:04}-" + "x" * 1024, health="Healthy") for i in range(5000)]
        return devices

    async def ListAndWatch(self, request, context):
        if BUG == "leaked-list-loop":
            mine = asyncio.Queue()

            async def loop():  # never stopped when the stream ends: the bug
                while True:
                    await mine.put(await self.changes.get())

            self.loops.add(asyncio.get_running_loop().create_task(loop()))
            while True:
                yield api_pb2.ListAndWatchResponse(devices=self.devices())
                await mine.get()
        while True:
            yield api_pb2.ListAndWatchResponse(devices=self.devices())
            if BUG == "return-from-listandwatch":
                return
            await self.changed.wait()
            self.changed.clear()

    async def GetPreferredAllocation(self, request, context):
        answers = []
        for c in request.container_requests:
            rest = [d for d in c.available_deviceIDs if d not in c.must_include_deviceIDs]
            chosen = (list(c.must_include_deviceIDs) + rest)[: c.allocation_size]
            answers.append(api_pb2.ContainerPreferredAllocationResponse(deviceIDs=chosen))
        return api_pb2.PreferredAllocationResponse(container_responses=answers)

    async def Allocate(self, request, context):
        if BUG == "empty-allocate":
            return api_pb2.AllocateResponse()
        responses = []
        for c in request.container_requests:
            for d in c.devices_ids:
                if d not in self.health:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown device {d}")
            responses.append(api_pb2.ContainerAllocateResponse(envs={"PYPLUG": ",".join(c.devices_ids)}))
        return api_pb2.AllocateResponse(container_responses=responses)

    async def PreStartContainer(self, request, context):
        print(f"pyplug: prestart {list(request.devices_ids)}", file=sys.stderr, flush=True)
        return api_pb2.PreStartContainerResponse()


async def main():
    plugin = Plugin()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, plugin.flip)
    loop.add_signal_handler(signal.SIGUSR2, os._exit, 3)
    path = os.path.join(DIR, SOCKET)
    if os.path.exists(path):
        if BUG == "socket-per-second":
            sys.exit(f"pyplug: listen unix {path}: bind: address already in use")
        os.unlink(path)
    if os.environ.get("PY_REGISTER_FIRST") == "1":
        registering = asyncio.create_task(register())
        await asyncio.sleep(1)
        server = await serve(plugin, path)
        await registering
    else:
        server = await serve(plugin, path)
        await register()
    if os.environ.get("PY_REREGISTER") == "1":
        await reregister_on_kubelet_restarts(plugin, path, server)
    await server.wait_for_termination()


async def serve(plugin, path):
    server = grpc.aio.server()
    api_pb2_grpc.add_DevicePluginServicer_to_server(plugin, server)
    server.add_insecure_port(f"unix:{path}")
    await server.start()
    return server


def kubelet_socket():
    try:
        found = os.stat(os.path.join(DIR, "kubelet.sock"))
    except FileNotFoundError:
        return None
    return (found.st_ino, found.st_ctime_ns)


async def reregister_on_kubelet_restarts(plugin, path, server):
    """A new kubelet.sock: serve again if the new kubelet removed our socket (it cleans its
    directory), with the same plugin object, and Register again."""
    registered_with = kubelet_socket()
    while True:
        await asyncio.sleep(0.1)
        now = kubelet_socket()
        if now is None or now == registered_with:
            continue
        if not os.path.exists(path):
            await server.stop(0)
            server = await serve(plugin, path)
        try:
            await register()
        except grpc.aio.AioRpcError as err:  # the new kubelet not serving yet: try again
            print(f"pyplug: Register: {err.code().name}", file=sys.stderr, flush=True)
            continue
        registered_with = now


async def register():
    async with grpc.aio.insecure_channel(f"unix:{os.path.join(DIR, 'kubelet.sock')}") as channel:
        await api_pb2_grpc.RegistrationStub(channel).Register(
            api_pb2.RegisterRequest(version="v1beta1", endpoint=SOCKET, resource_name=RESOURCE), timeout=15
        )
    print(f"pyplug: registered {RESOURCE}", file=sys.stderr, flush=True)


asyncio.run(main())
