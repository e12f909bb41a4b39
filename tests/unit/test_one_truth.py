"""Facts with one definition, and the copies that cannot import it held equal to it.

Kubernetes' facts are shim/facts.py's, the driver protocol's shim/driverprotocol.py's, the file
utilities shim/files.py's: a second definition anywhere in src/ or adapters/ fails here. Copies
remain only where an import is impossible (another language, the docs) or wrong on purpose (the
fake kubelet's name rules: a judge shares no code with what it judges): each is read here.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from shim.driverprotocol import PROTOCOL_VERSION
from shim.facts import KUBELET_PRESTART_DEADLINE_S, PRESTART_TIMEOUT_S
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


JUDGE_NAMES = "src/shim/compat/fakekubelet/names.py"  # the fake kubelet's own name rules, on purpose

# Each shared fact: a pattern only a definition of it matches, and the files that hold one (its
# home, and for the name rules the judge's copy). A second home fails the test, and so does a
# pattern that no longer finds the first (it would guard nothing).
ONE_HOME = {
    "the kubelet's socket name": (r'"kubelet\.sock"', {"src/shim/facts.py"}),
    "the pre-start deadlines": (r"\b\w*PRESTART_\w*_S\s*=", {"src/shim/facts.py"}),
    "the Register timeout": (r"\bREGISTER_TIMEOUT_S\s*=", {"src/shim/facts.py"}),
    "the DNS-1123 label": (r"\[a-z0-9\]\(\[-a-z0-9\]", {"src/shim/facts.py", JUDGE_NAMES}),
    "the extended resource name rule": (r"[\'\"]requests\.", {"src/shim/names.py", JUDGE_NAMES}),
    "semver": (r"\(0\|\[1-9\]\[0-9\]\*\)", {"src/shim/facts.py"}),
    "the protocol's major check": (r'split\("\."\)\[0\]', {"src/shim/driverprotocol.py"}),
    "one grant per container": (r"grants for \{", {"src/shim/driverhost/protocol.py"}),
    "the atomic write": (r"\bmkstemp\(|\bos\.fsync\(", {"src/shim/files.py"}),
    "the bounded read": (r"\bO_NONBLOCK\b", {"src/shim/files.py"}),
    "the outage overlay": (
        r"replace\(d, health=Health\.UNHEALTHY\) for d in",
        {"src/shim/driverhost/source.py"},
    ),
    "the DRA servicers": (r"def Node(Prepare|Unprepare|Watch)Resources", {"src/shim/dra/plugin/common.py"}),
}


def _python_sources() -> list[str]:
    paths = [*ROOT.glob("src/**/*.py"), *ROOT.glob("adapters/**/*.py")]
    return sorted(str(p.relative_to(ROOT)) for p in paths if "generated" not in p.parts)


@pytest.mark.parametrize("fact", sorted(ONE_HOME))
def test_each_shared_fact_has_one_home(fact: str) -> None:
    pattern, homes = ONE_HOME[fact]
    holding = {f for f in _python_sources() if re.search(pattern, (ROOT / f).read_text(encoding="utf-8"))}
    assert holding == homes, f"{fact}: defined in {sorted(holding)}, expected only in {sorted(homes)}"


def test_devshims_prestart_default_is_inside_the_kubelets_deadline() -> None:
    assert 0 < PRESTART_TIMEOUT_S < KUBELET_PRESTART_DEADLINE_S


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
