"""A vendor-style legacy v1beta1 device plugin, sharing no code with devshim.

Its stubs are generated from its own api.proto (the test does that into a temp dir
on PYTHONPATH). It serves its own socket, calls Register itself, and runs its own
ListAndWatch loop, like plugins written against the kubelet API directly.
Flags come from the environment: DP_DIR (default /var/lib/kubelet/device-plugins),
PY_RESOURCE, PY_DEVICES (comma-separated), PY_REGISTER_FIRST=1 (the common bug of
calling Register a second before serving). SIGUSR1 flips the last device's health;
SIGUSR2 exits with code 3 (a crash).

PY_BUG adds one deliberate bug, for `devshim compat --plugin` to find:
return-from-listandwatch (one list, then the stream ends), lowercase-health ("healthy"),
empty-allocate (no ContainerAllocateResponse), oversized-list (a first list over 4 MiB).
"""

import asyncio
import os
import signal
import sys

import api_pb2
import api_pb2_grpc
import grpc

DIR = os.environ.get("DP_DIR", "/var/lib/kubelet/device-plugins")
RESOURCE = os.environ.get("PY_RESOURCE", "example.com/pyplug")
SOCKET = "pyplug.sock"
DEVICES = os.environ.get("PY_DEVICES", "p0,p1,p2").split(",")
BUG = os.environ.get("PY_BUG", "")
BUGS = ("", "return-from-listandwatch", "lowercase-health", "empty-allocate", "oversized-list")
if BUG not in BUGS:
    sys.exit(f"pyplug: unknown PY_BUG {BUG!r}; known: {', '.join(BUGS[1:])}")


class Plugin(api_pb2_grpc.DevicePluginServicer):
    def __init__(self):
        self.health = {d: "Healthy" for d in DEVICES}
        self.changed = asyncio.Event()

    def flip(self):
        last = DEVICES[-1]
        self.health[last] = "Unhealthy" if self.health[last] == "Healthy" else "Healthy"
        self.changed.set()

    async def GetDevicePluginOptions(self, request, context):
        return api_pb2.DevicePluginOptions(pre_start_required=True, get_preferred_allocation_available=True)

    def devices(self):
        health = str.lower if BUG == "lowercase-health" else str
        devices = [api_pb2.Device(ID=d, health=health(self.health[d])) for d in DEVICES]
        if BUG == "oversized-list":  # 5000 devices with 1 KiB IDs: about 5 MiB
            devices += [api_pb2.Device(ID=f"pad{i:04}-" + "x" * 1024, health="Healthy") for i in range(5000)]
        return devices

    async def ListAndWatch(self, request, context):
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
        os.unlink(path)
    server = grpc.aio.server()
    api_pb2_grpc.add_DevicePluginServicer_to_server(plugin, server)
    server.add_insecure_port(f"unix:{path}")
    if os.environ.get("PY_REGISTER_FIRST") == "1":
        registering = asyncio.create_task(register())
        await asyncio.sleep(1)
        await server.start()
        await registering
    else:
        await server.start()
        await register()
    await server.wait_for_termination()


async def register():
    async with grpc.aio.insecure_channel(f"unix:{os.path.join(DIR, 'kubelet.sock')}") as channel:
        await api_pb2_grpc.RegistrationStub(channel).Register(
            api_pb2.RegisterRequest(version="v1beta1", endpoint=SOCKET, resource_name=RESOURCE), timeout=15
        )
    print(f"pyplug: registered {RESOURCE}", file=sys.stderr, flush=True)


asyncio.run(main())
