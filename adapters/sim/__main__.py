"""python -m adapters.sim --config FILE: the simulated driver as a program (devshim-sim)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from shim.sdk import run

from .config import ConfigError, load_config
from .driver import SimDriver


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="devshim-sim",
        description="A simulated devshim driver speaking the driver protocol on stdin/stdout.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", type=Path, help="YAML or JSON configuration file")
    source.add_argument("--config-json", help="the configuration as an inline JSON string")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config, args.config_json)
    except ConfigError as exc:
        print(f"devshim-sim: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    run(SimDriver(config), log_level=args.log_level)


if __name__ == "__main__":
    main()
