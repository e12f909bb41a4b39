"""Matching checked against references written here, over random names, allowlists and paths.

The policy compiles env allowlists and path globs into regular expressions; a slip there (a
'*' that crosses '/', a prefix that matches mid-name, a floor rule forgotten when another is
lifted) would quietly widen what a declaration allows. Each property compares the policy with a
plain implementation of what docs/configuration.md says. Examples are few and derandomised, so
the run takes seconds and a failure reproduces.
"""

from __future__ import annotations

import fnmatch
import re
import string
from collections.abc import Set as AbstractSet

from hypothesis import given, settings
from hypothesis import strategies as st

from shim.errors import GrantRefused
from shim.model import ContainerGrant, Mount
from shim.policy import FloorRule, GrantPolicy, GrantPolicySettings, Suggestion
from shim.policy.floor import ENV_RULES
from shim.policy.paths import Globs, glob_regex
from tests.unit.test_policy import RESOURCE, WHERE

EXAMPLES = settings(max_examples=200, deadline=None, derandomize=True, database=None)

# --- envs ----------------------------------------------------------------------------------------

# Pieces that build names near the floor's patterns, and some that are no names at all.
_ENV_PIECES = ["LD_", "PYTHON", "NODE_", "GIT_", "SIM_", "NVIDIA_", "PS", "4", "X", "_", "A", "1", "_OPTS",
               "_OPTIONS", "PATH", "BASH_FUNC_", "MALLOC_", "LESS", "OPEN", "-", " "]  # fmt: skip
ENV_NAMES = st.lists(st.sampled_from(_ENV_PIECES), min_size=1, max_size=4).map("".join)
ENV_ENTRIES = st.one_of(
    st.just("*"),
    ENV_NAMES.filter(lambda n: is_env_name(n)),
    ENV_NAMES.filter(lambda n: is_env_name(n)).map(lambda n: n + "*"),
)
LIFTED = st.sets(st.sampled_from([rule.name for rule in ENV_RULES]))


def is_env_name(name: str) -> bool:
    """POSIX's portable names: ASCII letters, digits and '_', not starting with a digit."""
    allowed = set(string.ascii_letters + string.digits + "_")
    return bool(name) and name[0] not in string.digits and set(name) <= allowed


def covered(name: str, entry: str) -> bool:
    return entry == "*" or name == entry or (entry.endswith("*") and name.startswith(entry[:-1]))


def floor_rule(name: str, lifted: AbstractSet[str]) -> str | None:
    """The first floor rule not lifted whose patterns (names, '*' for any run) match ``name``."""
    for rule in ENV_RULES:
        if rule.name not in lifted and any(fnmatch.fnmatchcase(name, p) for p in rule.patterns):
            return rule.name
    return None


@EXAMPLES
@given(
    names=st.lists(ENV_NAMES, min_size=1, max_size=4),
    entries=st.lists(ENV_ENTRIES, max_size=3),
    lifted=LIFTED,
)
def test_an_env_name_passes_exactly_when_declared_and_above_the_floor(
    names: list[str], entries: list[str], lifted: set[FloorRule]
) -> None:
    check = GrantPolicy(
        RESOURCE, GrantPolicySettings(envs=entries, unsafe=dict.fromkeys(lifted, True)), WHERE
    )
    # Names at the edges of each entry too: itself, longer, shorter, behind another prefix.
    stems = [entry.rstrip("*") for entry in entries]
    for name in names + [n for stem in stems for n in (stem, stem + "_1", stem[:-1], "X" + stem)]:
        expected = None  # None: passes; else the start of the refusal
        if not is_env_name(name):
            expected = "not an env name"
        elif (rule := floor_rule(name, lifted)) is not None:
            expected = f"the floor's rule {rule} refuses it"
        elif not any(covered(name, entry) for entry in entries):
            expected = f"not declared: {WHERE}.envs would allow it, e.g. [{name}]"
        try:
            check.check(ContainerGrant(envs={name: "x"}))
        except GrantRefused as refused:
            assert expected is not None and refused.rule.startswith(expected), (name, refused.rule)
        else:
            assert expected is None, (name, expected)


@EXAMPLES
@given(names=st.lists(ENV_NAMES, max_size=6))
def test_the_envs_a_suggestion_declares_pass_and_what_the_floor_refuses_stays_out(names: list[str]) -> None:
    """compat's suggested declaration, loaded, allows the names the grant needed; names the
    floor refuses are listed by rule instead, and no malformed name makes it unloadable."""
    grant = ContainerGrant(envs=dict.fromkeys(names, "x"))
    suggestion = Suggestion()
    suggestion.add(grant)
    declared = GrantPolicySettings(**suggestion.policy())
    floored = {name for values in suggestion.floor.values() for name in values}
    assert set(declared.envs) == {n for n in names if is_env_name(n) and floor_rule(n, set()) is None}
    assert floored == {n for n in names if is_env_name(n) and floor_rule(n, set()) is not None}
    check = GrantPolicy(RESOURCE, declared, WHERE)
    for name in declared.envs:
        check.check(ContainerGrant(envs={name: "x"}))


# --- path globs ----------------------------------------------------------------------------------

# No "**" inside a component ("a**"): docs/configuration.md gives "**" as a component of its own.
_GLOB_PARTS = st.sampled_from(["a", "b", "ab", "*", "?", "a*", "*b", "a?b", "*a*", "**"])
_PATH_PARTS = st.sampled_from(["a", "b", "ab", "ba", "aab", "bab", "", "*", "?"])
# Below a directory that does not exist: Globs resolves a glob's fixed head once, with realpath.
ROOT = "/devshim-test-absent"
GLOBS = st.lists(_GLOB_PARTS, min_size=1, max_size=4).map(lambda parts: ROOT + "/" + "/".join(parts))
PATHS = st.lists(_PATH_PARTS, min_size=0, max_size=5).map(lambda parts: "/".join([ROOT, *parts]))


def component_matches(pattern: str, name: str) -> bool:
    """fnmatch within one component: '*' any run of characters, '?' any one."""
    if not pattern:
        return not name
    if pattern[0] == "*":
        return any(component_matches(pattern[1:], name[i:]) for i in range(len(name) + 1))
    if not name or (pattern[0] != "?" and pattern[0] != name[0]):
        return False
    return component_matches(pattern[1:], name[1:])


def reference_matches(pattern: list[str], path: list[str]) -> bool:
    """Component by component; a "**" component stands for one or more components."""
    if not pattern:
        return not path
    if pattern[0] == "**":
        return any(reference_matches(pattern[1:], path[i:]) for i in range(1, len(path) + 1))
    return bool(path) and component_matches(pattern[0], path[0]) and reference_matches(pattern[1:], path[1:])


@EXAMPLES
@given(glob=GLOBS, paths=st.lists(PATHS, min_size=1, max_size=8))
def test_globs_match_as_a_component_wise_reference_does(glob: str, paths: list[str]) -> None:
    regex, globs = re.compile(glob_regex(glob)), Globs([glob])
    for path in paths:
        expected = reference_matches(glob.split("/"), path.split("/"))
        assert (regex.fullmatch(path) is not None) == expected, (glob, path)
        assert globs.cover(path) == expected, (glob, path)


@EXAMPLES
@given(glob=GLOBS.filter(lambda g: "**" not in g), paths=st.lists(PATHS, min_size=1, max_size=8))
def test_a_star_never_crosses_a_slash(glob: str, paths: list[str]) -> None:
    """Without "**", a glob matches only paths of as many components as it has."""
    regex = re.compile(glob_regex(glob))
    for path in paths:
        if regex.fullmatch(path):
            assert path.count("/") == glob.count("/"), (glob, path)
    # The same path with any component split in two is never matched.
    for path in paths:
        if regex.fullmatch(path) and path != ROOT:
            head, _, tail = path.rpartition("/")
            assert not regex.fullmatch(f"{head}/{tail[:1]}/{tail[1:]}"), (glob, path)


@EXAMPLES
@given(globs=st.lists(GLOBS, max_size=3), paths=st.lists(PATHS, min_size=1, max_size=8))
def test_several_globs_allow_what_any_one_of_them_allows(globs: list[str], paths: list[str]) -> None:
    together = Globs(globs)
    assert bool(together) == bool(globs)
    for path in paths:
        assert together.cover(path) == any(Globs([g]).cover(path) for g in globs), (globs, path)


@EXAMPLES
@given(glob=GLOBS, path=PATHS)
def test_a_glob_that_loads_allows_mounts_exactly_where_it_matches(glob: str, path: str) -> None:
    """Through the whole check, on paths that do not exist (judged as written) and normalised."""
    check = GrantPolicy(RESOURCE, GrantPolicySettings(mounts=[glob]), WHERE)
    grant = ContainerGrant(mounts=(Mount("/opt/x", path, True),))
    normalised = "/" + "/".join(p for p in path.split("/") if p)
    expected = reference_matches(glob.split("/"), normalised.split("/"))
    try:
        check.check(grant)
    except GrantRefused as refused:
        assert not expected, (glob, path, refused.rule)
    else:
        assert expected, (glob, path)
