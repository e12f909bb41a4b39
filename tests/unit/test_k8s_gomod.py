"""scripts/k8s_gomod.py: the go.mod that imports one k8s.io/kubernetes release replaces exactly the
staging modules that release's own go.mod points into its tree, with the published ones."""

from __future__ import annotations

import pytest

from scripts.k8s_gomod import render

# The shape of k8s.io/kubernetes' go.mod (v1.37.2): staging modules required at v0.0.0, each
# replaced by a folder under ./staging/src; other replaces and requires are left alone.
UPSTREAM = """module k8s.io/kubernetes

go 1.26.0

godebug default=go1.26

require (
\tgithub.com/google/go-cmp v0.7.0
\tk8s.io/api v0.0.0
\tk8s.io/kubelet v0.0.0
)

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/cri-api => ./staging/src/k8s.io/cri-api
\tk8s.io/kubelet => ./staging/src/k8s.io/kubelet
)

replace github.com/example/fork => github.com/example/fork v1.2.3
"""


def test_each_staging_module_is_replaced_by_its_published_release() -> None:
    text = render("v1.37.2", "example.com/judge", UPSTREAM)
    assert text.splitlines()[:5] == [
        "module example.com/judge",
        "",
        "go 1.26.0",
        "",
        "require k8s.io/kubernetes v1.37.2",
    ]
    replaced = [line.strip() for line in text.splitlines() if "=>" in line]
    assert replaced == [
        "k8s.io/api => k8s.io/api v0.37.2",
        "k8s.io/cri-api => k8s.io/cri-api v0.37.2",
        "k8s.io/kubelet => k8s.io/kubelet v0.37.2",
    ]


def test_a_prerelease_keeps_its_suffix() -> None:
    text = render("v1.38.0-beta.0", "example.com/judge", UPSTREAM)
    assert "\tk8s.io/api => k8s.io/api v0.38.0-beta.0" in text.splitlines()


@pytest.mark.parametrize("release", ["1.37.2", "v0.37.2", "v1.37", "latest"])
def test_anything_but_a_kubernetes_release_is_refused(release: str) -> None:
    with pytest.raises(SystemExit, match="is not a k8s.io/kubernetes release"):
        render(release, "example.com/judge", UPSTREAM)


def test_a_go_mod_without_staging_replaces_is_refused() -> None:
    with pytest.raises(SystemExit, match="replaces no staging modules"):
        render("v1.37.2", "example.com/judge", "module k8s.io/kubernetes\n\ngo 1.26.0\n")


def test_a_local_module_is_required_from_its_folder() -> None:
    """A judge's release module uses the shared harness from ../harness (docs/architecture.md)."""
    text = render("v1.37.2", "example.com/k8s-1.37", UPSTREAM, {"example.com/harness": "../harness"})
    lines = text.splitlines()
    assert lines[lines.index("require k8s.io/kubernetes v1.37.2") + 2 :][:3] == [
        "require example.com/harness v0.0.0",
        "",
        "replace example.com/harness => ../harness",
    ]
