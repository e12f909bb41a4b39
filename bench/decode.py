"""Decoding a 50,000-device list_devices answer: devshim's host path beside the alternatives.

Usage: python -m bench.decode [--devices N]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import betterproto2
import orjson
from google.protobuf import json_format

from shim.driverhost import protocol
from shim.sdk.generated.devshim.driver import v1 as types
from shim.sdk.generated.protobuf.driver.v1 import driver_pb2


def timed(label: str, work: Callable[[], object]) -> None:
    start = time.perf_counter()
    work()
    print(f"  {label:48s} {time.perf_counter() - start:6.3f} s")


def main(count: int) -> None:
    result = types.ListDevicesResult(
        devices=[
            types.Device(id=f"dev-{i}", health=types.Health.HEALTHY, numa_nodes=[i % 2]) for i in range(count)
        ]
    )
    print(f"{count} devices")
    encoded = ""

    def encode() -> None:
        nonlocal encoded
        encoded = json.dumps(result.to_dict(casing=betterproto2.Casing.SNAKE))

    timed("betterproto2 to_dict + json.dumps (encode)", encode)
    timed("orjson.loads + model (devshim's host)", lambda: protocol.devices_from_json(orjson.loads(encoded)))
    timed("protobuf json_format.Parse", lambda: json_format.Parse(encoded, driver_pb2.ListDevicesResult()))
    timed("betterproto2 from_dict", lambda: types.ListDevicesResult.from_dict(json.loads(encoded)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=50_000)
    main(parser.parse_args().devices)
