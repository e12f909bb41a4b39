"""python -m devshim_adapters.legacy --kubelet-dir DIR [--resource NAME ...] [--list-wait S]
                                    [--plugin-env K=V ...] [-- PLUGIN COMMAND...]

Without a command (the sidecar form) the legacy plugin runs in its own container and
registers on DIR/kubelet.sock, DIR being an emptyDir it mounts at
/var/lib/kubelet/device-plugins. With a command (the subprocess form) the adapter
starts it and restarts it when it exits.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from shim.sdk import run

from .driver import LIST_WAIT_S, LegacyAdapter
from .process import LegacyProcess, child_env


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="devshim-legacy", description="devshim driver in front of an unmodified v1beta1 device plugin"
    )
    parser.add_argument(
        "--kubelet-dir", type=Path, required=True, help="the legacy plugin's device-plugins dir"
    )
    parser.add_argument("--plugin-env", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--socket-mode", type=lambda text: int(text, 8), default=0o600,
        help="mode of our kubelet.sock (0666 when the legacy container runs as another user)",
    )  # fmt: skip
    parser.add_argument(
        "--resource", action="append", default=[], metavar="NAME", dest="resources",
        help="a resource name the legacy plugin may register (repeatable); when given, any other is refused",
    )  # fmt: skip
    parser.add_argument(
        "--list-wait", type=float, default=LIST_WAIT_S, metavar="SECONDS", dest="list_wait_s",
        help="how long the adapter waits for the legacy plugin's first list: in devshim's list_devices "
        f"of a --resource (default {LIST_WAIT_S:g}; keep it below drivers[].timeouts.list_devices_s), "
        "and at its start, at most 10 s",
    )  # fmt: skip
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the legacy plugin's command")
    args = parser.parse_args(argv)
    if not args.list_wait_s > 0:
        parser.error("--list-wait must be a positive number of seconds")
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        process = LegacyProcess(command, child_env(args.plugin_env)) if command else None
    except ValueError as exc:
        parser.error(str(exc))
    run(LegacyAdapter(args.kubelet_dir, process, args.socket_mode, args.resources, args.list_wait_s))


if __name__ == "__main__":
    main(sys.argv[1:])
