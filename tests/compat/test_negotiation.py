"""API version negotiation with v1beta2 (experimental) enabled."""

from __future__ import annotations

from pathlib import Path

from shim.bootstrap import Shim
from shim.compat.fakekubelet import FakeKubelet
from tests.support.shim_fixtures import FOO, settings_for
from tests.support.waiting import until


async def test_a_v1beta1_kubelet_gets_v1beta1_when_v1beta2_is_offered_first(
    plugin_dir: Path, kubelet: FakeKubelet
) -> None:
    """With both versions offered, Register is tried as v1beta2 first; a kubelet without that
    Registration service answers UNIMPLEMENTED and devshim falls back to v1beta1."""
    settings = settings_for(plugin_dir, {FOO: {"count": 2}}, api_versions=["v1beta1", "v1beta2"])
    async with Shim(settings) as shim:
        record = await kubelet.wait_for_registration(FOO)
        assert record.ok and record.version == "v1beta1"
        session = await kubelet.wait_for_plugin(FOO)
        assert len(await session.wait_for_list()) == 2
        # Set when devshim reads Register's answer, which the kubelet may send after it dials.
        endpoint = shim.served[FOO].endpoint
        await until(lambda: endpoint.negotiated == "v1beta1", f"v1beta1 negotiated ({endpoint.negotiated})")


def test_v1beta2_is_not_offered_by_default(plugin_dir: Path) -> None:
    """No real kubelet is handed the experimental version unless it is enabled."""
    assert settings_for(plugin_dir, {FOO: {"count": 1}}).api_versions == ["v1beta1"]
