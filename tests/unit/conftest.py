"""Fixtures of the unit tests (tests/conftest.py has those every directory shares)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.unix import short_temp_dir


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path: socket paths must fit in 107 bytes."""
    with short_temp_dir("ds-") as path:
        yield path
