"""A fake kubelet on a directory, from the command line, printing what it sees.

    python -m shim.compat.fakekubelet.serve DIR [--profile 1.33+] [--versions v1beta1,v1beta2]

For trying devshim (or any device plugin) on a machine without a kubelet: it serves kubelet.sock
in DIR, and prints every registration and every device list it receives until Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from pathlib import Path

from .fake_kubelet import FakeKubelet
from .profiles import PROFILES
from .versions import API_VERSIONS


async def serve(directory: Path, profile: str, versions: list[str]) -> None:
    async with FakeKubelet(directory, profile=profile, versions=versions) as kubelet:
        print(
            f"fake kubelet ({profile}, {', '.join(kubelet.versions)}) on {kubelet.kubelet_socket}", flush=True
        )
        seen_registrations = 0
        seen_lists: dict[object, int] = {}
        while True:
            for record in kubelet.registrations[seen_registrations:]:
                outcome = "registered" if record.ok else f"refused: {record.error}"
                print(f"{record.resource_name}: {outcome} ({record.version}, {record.endpoint})", flush=True)
            seen_registrations = len(kubelet.registrations)
            for record in kubelet.registrations:
                with contextlib.suppress(KeyError):
                    session = kubelet.plugin(record.resource_name)
                    new = session.lists[seen_lists.get(session, 0) :]
                    seen_lists[session] = len(session.lists)
                    for devices in new:
                        listed = " ".join(f"{d.id}:{d.health}" for d in devices)
                        print(f"{record.resource_name}: {len(devices)} devices: {listed}", flush=True)
            await asyncio.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m shim.compat.fakekubelet.serve", description=__doc__.splitlines()[0]
    )
    parser.add_argument("directory", type=Path, help="the device-plugins directory to serve kubelet.sock in")
    parser.add_argument("--profile", default="next", choices=list(PROFILES))
    parser.add_argument(
        "--versions", default="v1beta1", help=f"comma-separated, of {', '.join(API_VERSIONS)}"
    )
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.directory, args.profile, args.versions.split(",")))


if __name__ == "__main__":
    main()
