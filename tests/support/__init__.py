"""Not tests: what the tests share (test-only drivers, a scripted plugin, fixtures, waiting)."""

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
ROOT = SUPPORT.parents[1]  # the checkout
DRIVERS = SUPPORT / "drivers"  # test-only drivers, run as real subprocesses
LEGACY_PLUGINS = SUPPORT / "legacy_plugins"  # device plugins sharing no code with devshim: go/, python/
