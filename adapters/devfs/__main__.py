"""python -m devshim_adapters.devfs --config FILE: the device-node driver as a program (devshim-devfs)."""

from __future__ import annotations

import argparse
from pathlib import Path

from shim.sdk import run_configured

from .config import load_config
from .driver import DevfsDriver


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="devshim-devfs",
        description="A devshim driver serving host device nodes matched by glob, over stdin/stdout.",
    )
    parser.add_argument("--config", type=Path, required=True, help="YAML or JSON configuration file")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    args = parser.parse_args(argv)
    run_configured("devshim-devfs", lambda: DevfsDriver(load_config(args.config)), log_level=args.log_level)


if __name__ == "__main__":
    main()
