"""Facts with one definition, and the copies that cannot import it held equal to it.

The driver protocol's version is shim/driverprotocol.py's; the kubelet's PreStartContainer deadline
and devshim's default inside it are shim/model.py's. Copies remain where an import is impossible
(another language, a layer that may not import devshim's modules, the docs): each is read here.
"""

from __future__ import annotations

import re
from typing import Any

from adapters.legacy import driver as legacy
from shim.compat import fakekubelet as kubelet
from shim.driverprotocol import PROTOCOL_VERSION
from shim.model import KUBELET_PRESTART_DEADLINE_S, PRESTART_TIMEOUT_S
from shim.settings import DriverTimeouts
from tests.support import ROOT

MAJOR = PROTOCOL_VERSION.split(".")[0]


def _found(pattern: str, relative: str) -> list[Any]:
    """Every match in the file: a group's text, or a tuple of them for several groups."""
    found = re.findall(pattern, (ROOT / relative).read_text(encoding="utf-8"))
    assert found, f"{relative} no longer matches {pattern!r}: update this test"
    return found


def test_the_node_example_speaks_our_protocol_version() -> None:
    """adapters/examples/node/driver.js keeps the version, and the major it accepts, as constants."""
    script = "adapters/examples/node/driver.js"
    assert _found(r'const PROTOCOL_VERSION = "([^"]*)";', script) == [PROTOCOL_VERSION]
    assert _found(r"const PROTOCOL_MAJOR = (\d+);", script) == [MAJOR]


def test_the_documented_protocol_version_is_ours() -> None:
    """The spec's title, every protocol_version its examples and the node example's README show,
    the major the README says it accepts, and the schema's comment."""
    spec = "docs/driver-protocol.md"
    assert _found(r"^# The driver protocol, version (\S+)", spec) == [PROTOCOL_VERSION]
    for relative in (spec, "adapters/examples/node/README.md"):
        assert set(_found(r"protocol_version\W{1,5}(\d+\.\d+\.\d+)", relative)) == {PROTOCOL_VERSION}
    assert _found(r"semver with major (\d+)", "adapters/examples/node/README.md") == [MAJOR]
    assert _found(r'semver \("([^"]*)"\)', "proto/driver/v1/driver.proto") == [PROTOCOL_VERSION]


def test_the_fake_kubelet_has_the_kubelets_prestart_deadline() -> None:
    """shim/compat/fakekubelet/ may import nothing of devshim's, so it keeps its own copy."""
    assert kubelet.PRESTART_TIMEOUT_S == KUBELET_PRESTART_DEADLINE_S


def test_devshims_prestart_default_is_inside_the_kubelets_deadline() -> None:
    """And the legacy adapter, a driver that may not import shim.model, forwards a prestart for
    no longer than devshim waits for it by default."""
    assert 0 < PRESTART_TIMEOUT_S < KUBELET_PRESTART_DEADLINE_S
    assert 0 < legacy.PRESTART_TIMEOUT_S <= PRESTART_TIMEOUT_S


def test_the_documented_prestart_timeouts_are_the_real_ones() -> None:
    """docs/configuration.md's example and the default timeouts in docs/driver-protocol.md's
    method table, which also names the kubelet's deadline."""
    pattern = r"\n *prestart(?:_timeout)?_s: ([\d.]+) +# must stay under the kubelet's (\d+) s"
    shown = [(float(s), float(k)) for s, k in _found(pattern, "docs/configuration.md")]
    assert shown == [(PRESTART_TIMEOUT_S, KUBELET_PRESTART_DEADLINE_S)] * 2
    table = dict(_found(r"\n\| `(\w+)` \| `\w+` → `\w+` \|[^|]*\| (\d+) s", "docs/driver-protocol.md"))
    assert {m: float(s) for m, s in table.items()} == {
        name.removesuffix("_s"): value for name, value in DriverTimeouts().model_dump().items()
    }
    (kubelet_s,) = _found(r"\| `prestart` \|[^\n]*\(the kubelet allows (\d+) s\)", "docs/driver-protocol.md")
    assert float(kubelet_s) == KUBELET_PRESTART_DEADLINE_S
