"""Hypothesis settings shared by the fuzz tests: quick and reproducible in CI, long on demand.

The default ("ci") runs each test's own modest number of examples, derandomized (the same
examples every run, so a CI failure reproduces locally) and without an example database. For a
long exploratory run:

    HYPOTHESIS_PROFILE=long python -m pytest tests/fuzz -p no:cacheprovider --timeout 0

"long" runs 50 times as many examples (DEVSHIM_FUZZ_FACTOR changes the factor), randomly, and
keeps failing examples in .hypothesis/ (gitignored) so the next run tries them first.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
FACTOR = int(os.environ.get("DEVSHIM_FUZZ_FACTOR", "50")) if PROFILE == "long" else 1

# Every example talks to real servers and processes: wall time says nothing about a bug, and
# generating a 10,000-ID request is meant to be big.
_SHARED = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
    print_blob=True,
)
settings.register_profile("ci", _SHARED, derandomize=True, database=None)
settings.register_profile("long", _SHARED, derandomize=False)
settings.load_profile(PROFILE)


def examples(ci: int) -> settings:
    """Settings running ``ci`` examples in CI, FACTOR times as many in a long run."""
    return settings(max_examples=ci * FACTOR)
