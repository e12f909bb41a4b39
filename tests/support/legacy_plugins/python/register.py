"""Register calls as any process that can reach a kubelet.sock can make them, sharing no code with
devshim (it runs on the same self-generated stubs as plugin.py).

Reads JSON from stdin: {"socket": PATH, "registrations": [[RESOURCE, ENDPOINT], ...]} (JSON, so
an endpoint may hold any character, NUL included). Sends one RegisterRequest per pair, in order,
and prints a JSON list with, for each, null when it was accepted or the error's details.
"""

import asyncio
import json
import sys

import api_pb2
import api_pb2_grpc
import grpc


async def main():
    job = json.load(sys.stdin)
    results = []
    async with grpc.aio.insecure_channel(f"unix:{job['socket']}") as channel:
        stub = api_pb2_grpc.RegistrationStub(channel)
        for resource, endpoint in job["registrations"]:
            request = api_pb2.RegisterRequest(version="v1beta1", endpoint=endpoint, resource_name=resource)
            try:
                await stub.Register(request, timeout=15)
                results.append(None)
            except grpc.aio.AioRpcError as err:
                results.append(f"{err.code().name}: {err.details()}")
    print(json.dumps(results), flush=True)


asyncio.run(main())
