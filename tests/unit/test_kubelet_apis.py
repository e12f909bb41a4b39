"""The table devshim imports its kubelet API version modules from (shim/bootstrap.py): one module
per version the settings accept, each the version it is named for, offered newest first."""

from __future__ import annotations

from typing import get_args

from shim.bootstrap import API_MODULES, kubelet_apis
from shim.settings import Settings


def test_every_version_the_settings_accept_has_its_module_and_only_those() -> None:
    (accepted,) = get_args(Settings.model_fields["api_versions"].annotation)
    assert set(API_MODULES) == set(get_args(accepted))
    assert [api.name for api in kubelet_apis(list(API_MODULES))] == list(API_MODULES)


def test_only_the_configured_versions_are_offered_newest_first() -> None:
    assert [api.name for api in kubelet_apis(["v1beta1"])] == ["v1beta1"]
    assert [api.name for api in kubelet_apis(["v1beta1", "v1beta2"])] == ["v1beta2", "v1beta1"]
