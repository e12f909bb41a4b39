"""Not tests: what the tests share (test-only drivers, a scripted plugin, fixtures, waiting)."""

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
ROOT = SUPPORT.parents[1]  # the checkout
DRIVERS = SUPPORT / "drivers"  # test-only drivers, run as real subprocesses
LEGACY_PLUGINS = SUPPORT / "legacy_plugins"  # device plugins sharing no code with devshim: go/, python/
# The drivers[] setting for a test's driver: root, since the tests' drivers, their interpreter
# and their files live where user nobody, a driver's default, cannot read (pytest's and CI's
# temporary folders are root's alone). The default itself: test_driver_identity.py.
AS_ROOT = {"user": "root"}
