"""shim/runtime.py sets the allocator so that a large buffer freed is reused, not mapped afresh:
a driver's 2 MB list copied into fresh pages costs a page fault a page (2 ms here), on the loop."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# Page faults taken by the second of two 4 MB buffers, the first freed before it; 1,000 when it
# is mapped afresh (a fault for each 4 KiB page).
SECOND_BUFFER = textwrap.dedent(
    """
    import resource, sys
    if sys.argv[1] == "set":
        from shim.runtime import _reuse_large_buffers
        _reuse_large_buffers()
    data = b"x" * 4_000_000
    del data
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    data = b"y" * 4_000_000
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    """
)


def _faults(mode: str) -> int:
    run = subprocess.run(
        [sys.executable, "-c", SECOND_BUFFER, mode], capture_output=True, text=True, check=True
    )
    return int(run.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_large_buffer_freed_is_reused_without_page_faults() -> None:
    assert _faults("default") > 500  # the allocator as it comes: mapped afresh
    assert _faults("set") < 50
