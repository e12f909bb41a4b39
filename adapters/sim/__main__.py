"""python -m adapters.sim --config FILE: the simulated driver as a program (devshim-sim)."""

from __future__ import annotations

import argparse
from pathlib import Path

from shim.sdk import run_configured

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
    make = lambda: SimDriver(load_config(args.config, args.config_json))  # noqa: E731
    run_configured("devshim-sim", make, (ConfigError,), log_level=args.log_level)


if __name__ == "__main__":
    main()
