"""Per-node configs (settings `node_configs`, shim/nodeconfig.py): a label on the node's Node,
read from a real kube-apiserver, chooses which named config `devshim run` serves, and a change
of the label switches it in the same process, as SIGHUP would; the fake kubelet sees the
resources come and go. A label naming a config that does not load changes nothing and says so;
a label removed brings back the default; a start without the API server serves the default and
switches once the label is read."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from shim.compat.fakekubelet import FakeKubelet
from shim.compat.realnode import ControlPlane
from shim.configfile import ConfigError
from shim.nodeconfig import NodeConfigs
from shim.settings import Settings
from tests.deploy.tools import require_helm
from tests.support import ROOT
from tests.support.devshim_process import DEVSHIM, devshim
from tests.support.unix import short_temp_dir

LABEL = "devshim.example.com/config"
DEFAULT, BIG, SMALL = "example.com/default", "example.com/big", "example.com/small"


class Log:
    """devshim's stderr, read as it comes (so the pipe never fills), searchable for a line."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.lines: list[str] = []
        self._changed = asyncio.Condition()
        self._reader = asyncio.create_task(self._read(proc))

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stderr is not None
        while line := await proc.stderr.readline():
            async with self._changed:
                self.lines.append(line.decode(errors="replace"))
                self._changed.notify_all()

    async def wait_for(self, text: str, timeout: float = 60) -> str:
        """The first line holding ``text``, once one does."""
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: any(text in line for line in self.lines))
        return next(line for line in self.lines if text in line)

    def close(self) -> None:
        self._reader.cancel()


@contextlib.asynccontextmanager
async def running(config: Path) -> AsyncIterator[tuple[asyncio.subprocess.Process, Log]]:
    async with devshim("run", "--config", str(config)) as proc:
        log = Log(proc)
        try:
            yield proc, log
        except BaseException:
            print("--- devshim's log:\n" + "".join(log.lines[-60:]))
            raise
        finally:
            log.close()


def static(name: str, count: int) -> dict[str, Any]:
    return {"name": name, "static": {"count": count}}


@pytest.fixture
def folder() -> Iterator[Path]:
    with short_temp_dir("ds-nc-") as path:
        yield path


def write_configs(
    folder: Path, plugin_dir: Path, state_dir: Path, node: str, kubeconfig: Path, wait_s: float = 30
) -> Path:
    """The default config (one DEFAULT device, the node_configs), and two named ones in
    folder/nodes: big (two BIG devices) and small (three SMALL)."""
    base = {"device_plugins_dir": str(plugin_dir), "state_dir": str(state_dir)}
    nodes = folder / "nodes"
    nodes.mkdir()
    (nodes / "big.yaml").write_text(yaml.safe_dump({**base, "resources": [static(BIG, 2)]}))
    (nodes / "small.yaml").write_text(yaml.safe_dump({**base, "resources": [static(SMALL, 3)]}))
    default = folder / "config.yaml"
    chooser: dict[str, Any] = {"label": LABEL, "folder": str(nodes), "node_name": node}
    chooser |= {"kubeconfig": str(kubeconfig), "wait_s": wait_s}
    default.write_text(yaml.safe_dump({**base, "resources": [static(DEFAULT, 1)], "node_configs": chooser}))
    return default


def label(plane: ControlPlane, node: str, value: str | None) -> None:
    """Sets the Node's label (None: removes it), as `kubectl label node` does (read, then
    written holding its resourceVersion)."""
    current = plane.request("GET", f"/api/v1/nodes/{node}")
    labels = {k: v for k, v in (current["metadata"].get("labels") or {}).items() if k != LABEL}
    current["metadata"]["labels"] = labels | ({LABEL: value} if value is not None else {})
    plane.request("PUT", f"/api/v1/nodes/{node}", current)


def make_node(plane: ControlPlane, node: str, value: str | None) -> None:
    labels = {LABEL: value} if value else {}
    plane.request(
        "POST",
        "/api/v1/nodes",
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": labels}},
    )


async def gone(kubelet: FakeKubelet, resource: str) -> None:
    """Waits until devshim no longer serves ``resource``: its stream to the kubelet ended."""
    session = kubelet.plugin(resource)
    async with asyncio.timeout(60):
        await session.stream_ended.wait()


async def test_the_label_chooses_the_config_and_a_change_switches_it_in_the_same_process(
    plane: ControlPlane, folder: Path, plugin_dir: Path, state_dir: Path, kubelet: FakeKubelet
) -> None:
    node = "node-configs-a"
    make_node(plane, node, "big")
    config = write_configs(folder, plugin_dir, state_dir, node, plane.admin_kubeconfig)
    async with running(config) as (proc, log):
        big = await kubelet.wait_for_plugin(BIG, timeout=60)
        assert len(await big.wait_for_list(lambda d: len(d) == 2, timeout=30)) == 2
        await log.wait_for(f"node configs: label {LABEL} is 'big': serving {folder / 'nodes' / 'big.yaml'}")
        assert DEFAULT not in {r.resource_name for r in kubelet.registrations}  # never served first

        label(plane, node, "small")
        small = await kubelet.wait_for_plugin(SMALL, timeout=60)
        assert len(await small.wait_for_list(lambda d: len(d) == 3, timeout=30)) == 3
        await gone(kubelet, BIG)
        await log.wait_for("node label: reloading the config")

        label(plane, node, "missing")  # names no file: refused, and small keeps serving
        await log.wait_for("node label: the new config is not used, nothing changed: node label "
                           f"{LABEL}=missing: cannot read config file")  # fmt: skip
        assert not small.stream_ended.is_set()
        assert await small.allocate([(await small.wait_for_list())[0].id]) is not None

        label(plane, node, None)  # no label: the default
        default = await kubelet.wait_for_plugin(DEFAULT, timeout=60)
        assert len(await default.wait_for_list(lambda d: len(d) == 1, timeout=30)) == 1
        await gone(kubelet, SMALL)

        proc.send_signal(signal.SIGHUP)  # SIGHUP still reloads the file the label names (none)
        await log.wait_for("SIGHUP: reloading the config")
        assert proc.returncode is None  # one process throughout


async def test_without_the_api_server_the_default_serves_until_the_label_is_read(
    plane: ControlPlane, folder: Path, plugin_dir: Path, state_dir: Path, kubelet: FakeKubelet
) -> None:
    """A kubeconfig naming a port nothing listens on: the default serves once wait_s has passed;
    the kubeconfig mended, the follower's next try reads the label and switches to its config."""
    node = "node-configs-b"
    make_node(plane, node, "big")
    broken = folder / "broken.kubeconfig"
    text = plane.admin_kubeconfig.read_text()
    broken.write_text(text.replace(plane.url, "https://127.0.0.1:9"))
    config = write_configs(folder, plugin_dir, state_dir, node, broken, wait_s=2)
    async with running(config) as (_, log):
        default = await kubelet.wait_for_plugin(DEFAULT, timeout=90)
        await log.wait_for(f"node configs: cannot read node {node}'s label {LABEL}")
        await log.wait_for("the default config serves until it is", timeout=90)
        broken.write_text(text)  # the credentials mended: the next try reads the label
        big = await kubelet.wait_for_plugin(BIG, timeout=120)
        assert len(await big.wait_for_list(lambda d: len(d) == 2, timeout=30)) == 2
        async with asyncio.timeout(60):
            await default.stream_ended.wait()


def test_a_named_config_may_not_choose_again(folder: Path) -> None:
    """Only the default config says how configs are chosen: a named one that sets node_configs
    is refused, naming the label that chose it."""
    nodes = folder / "nodes"
    nodes.mkdir()
    chooser = {"label": LABEL, "folder": str(nodes), "node_name": "n"}
    (nodes / "loop.yaml").write_text(yaml.safe_dump({"node_configs": chooser}))
    configs = NodeConfigs(Settings.load(None, node_configs=chooser).node_configs, None, Settings.load)  # type: ignore[arg-type]
    configs.name = "loop"
    with pytest.raises(
        ConfigError, match=f"node label {LABEL}=loop: .* sets node_configs, which only the default"
    ):
        configs.load()


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("label", "not a label", "is not a label key"),
        ("label", "example.com/" + "x" * 64, "is not a label key"),
        ("node_name", "Not_A_Node", ""),
    ],
)
def test_bad_node_configs_settings_are_refused(folder: Path, field: str, value: str, problem: str) -> None:
    chooser = {"label": LABEL, "folder": str(folder), "node_name": "n", field: value}
    with pytest.raises(ConfigError, match=rf"node_configs\.?{field if field == 'label' else ''}.*{problem}"):
        Settings.load(None, node_configs=chooser)


def test_check_config_lists_the_named_configs_and_refuses_a_broken_one(folder: Path) -> None:
    """Outside the pod (no NODE_NAME, no node_name): each named config summarised; one that does
    not load fails the check, named; a folder missing here is said, not fatal."""
    base = {"device_plugins_dir": str(folder / "dp"), "state_dir": str(folder / "state")}
    write_configs(folder, folder / "dp", folder / "state", "n", folder / "kubeconfig")
    config = folder / "config.yaml"
    data = yaml.safe_load(config.read_text())
    del data["node_configs"]["node_name"]
    config.write_text(yaml.safe_dump(data))
    env = {k: v for k, v in os.environ.items() if k != "NODE_NAME"}

    def check() -> subprocess.CompletedProcess[str]:
        command = [*DEVSHIM, "check-config", str(config)]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)

    checked = check()
    assert checked.returncode == 0, checked.stderr
    assert f"node configs: the node's label {LABEL} chooses a file in {folder / 'nodes'}" in checked.stdout
    assert f"  {LABEL}=big: serves {BIG}\n  {LABEL}=small: serves {SMALL}\n" in checked.stdout

    (folder / "nodes" / "typo.yaml").write_text(yaml.safe_dump({**base, "resourcez": []}))
    checked = check()
    assert checked.returncode == 2
    assert "devshim: node config typo: invalid settings" in checked.stderr and "resourcez" in checked.stderr

    data["node_configs"]["folder"] = str(folder / "elsewhere")
    config.write_text(yaml.safe_dump(data))
    checked = check()
    assert checked.returncode == 0, checked.stderr
    assert f"{folder / 'elsewhere'} is not a directory here (fine if the pod mounts it)" in checked.stdout


def chart_rbac(namespace: str) -> list[dict[str, Any]]:
    """The chart's ServiceAccount, ClusterRole and ClusterRoleBinding for per-node configs
    (`helm template` with deploy/examples/helm/node-configs.yaml)."""
    chart = ROOT / "deploy" / "helm" / "devshim"
    rendered = subprocess.run(
        [require_helm(), "template", "devshim", str(chart), "--namespace", namespace,
         "--values", str(ROOT / "deploy" / "examples" / "helm" / "node-configs.yaml")],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    kinds = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")
    return [d for d in yaml.safe_load_all(rendered) if d and d["kind"] in kinds]


COLLECTIONS = {
    "ServiceAccount": "/api/v1/namespaces/{namespace}/serviceaccounts",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
}


async def test_the_charts_rbac_lets_the_pods_token_follow_its_nodes_label(
    plane: ControlPlane, folder: Path, plugin_dir: Path, state_dir: Path, kubelet: FakeKubelet
) -> None:
    """devshim with a token of the chart's account bound to a pod on the node, as the chart's pod
    holds it, and the chart's ClusterRole: it reads and follows its Node's label. The same token
    without the binding reads nothing (403), and the default serves: the rule is what lets it."""
    namespace = "devshim-nc"
    plane.ensure("/api/v1/namespaces", {"metadata": {"name": namespace}})
    objects = chart_rbac(namespace)
    (account,) = [o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"]
    node = "node-configs-c"
    make_node(plane, node, "small")
    token = plane.node_bound_token(namespace, account, node)
    kubeconfig = plane.kubeconfig_for_token(token, folder / "token.kubeconfig")
    config = write_configs(folder, plugin_dir, state_dir, node, kubeconfig, wait_s=1)

    async with running(config) as (_, log):  # no ClusterRole yet
        await kubelet.wait_for_plugin(DEFAULT, timeout=60)
        await log.wait_for(
            f"node configs: cannot read node {node}'s label {LABEL}: GET /api/v1/nodes/{node}: 403"
        )

    for obj in objects:
        plane.ensure(COLLECTIONS[obj["kind"]].format(namespace=namespace), obj)
    async with running(config) as (_, log):
        small = await kubelet.wait_for_plugin(SMALL, timeout=60)
        assert len(await small.wait_for_list(lambda d: len(d) == 3, timeout=30)) == 3
        label(plane, node, "big")
        await kubelet.wait_for_plugin(BIG, timeout=60)
        await gone(kubelet, SMALL)
