"""Every Go program the default suite runs, built (or found in the judges' cache) up front.

.ci/run calls this ahead of the README's test command: a cold build takes minutes, and inside a
test it counts against that test's timeout, which a busy machine then exceeds (the build-first
tests order builds within one pytest worker, not across two). Warm, it finds everything cached
in a second. By hand: `python -m tests.support.prebuild`.
"""

from __future__ import annotations

import shutil
import time

from shim.compat.realnode import containerd
from shim.compat.realnode.connected import connected_releases
from shim.compat.upstream import releases as upstream
from tests.conformance import builds
from tests.support import control_plane, dra_judge, judge, real_node


def _built(what: str, started: float) -> None:
    print(f"prebuild: {what} ({time.monotonic() - started:.0f} s)", flush=True)


def main() -> None:
    started = time.monotonic()
    # The Go SDK's programs (the conformance suite's and the bench's): seconds each, cached by source.
    if shutil.which("go") is not None:
        for name in builds.PROGRAMS:
            builds.built(name)
        _built(f"Go SDK programs {', '.join(builds.PROGRAMS)}", started)
    for release in judge.DEFAULT:
        upstream.build(release, log=False)
        _built(f"device manager {release.name}", started)
    for release in {*real_node.DEFAULT, real_node.KUBELETS[0], real_node.KUBELETS[-1]}:
        upstream.build(release, program=upstream.KUBELET_PROGRAM, log=False)
        _built(f"kubelet {release.name}", started)
    for release in {*control_plane.DEFAULT, *control_plane.BOTH_ENDS}:
        dra_judge.build(release)  # its DRA manager, kube-apiserver and etcd
        _built(f"DRA manager and control plane {release.name}", started)
    # The API server upgrade row's target: the release after the oldest control plane's.
    oldest = control_plane.BOTH_ENDS[0]
    newer = [r for r in control_plane.APISERVERS if r.minor > oldest.minor]
    if newer:
        control_plane.build(newer[0])
        _built(f"control plane {newer[0].name} (the upgrade target)", started)
    # The fleet row's Go publishers (bench/fleet.py, which tests/test_bench_smoke.py runs).
    for release in upstream.releases():
        if release.minor == 37:
            upstream.build(release, program="slicefleet", log=False)
            _built(f"slicefleet {release.name}", started)
    # The connected node's (tests/compat/test_real_node_dra.py): its kubelet and control plane are
    # built above; the scheduler links from their packages, containerd 2.x with CDI is its own.
    for release in connected_releases()[-1:]:
        upstream.build(release, program=upstream.SCHEDULER_PROGRAM, log=False)
        _built(f"kube-scheduler {release.name}", started)
        containerd.with_cdi(log=False)
        _built("containerd with CDI", started)


if __name__ == "__main__":
    main()
