"""A control plane: etcd and the upstream kube-apiserver of a release (shim.compat.realnode.controlplane).

What the API server does is checked through its own HTTPS API: which resource.k8s.io (DRA)
versions it serves, a ResourceSlice written and read back, an object kept over an upgrade from
1.33 to 1.34 on the same etcd, the node name in a node-bound service account token. By default
the newest release runs; --full-matrix adds the others and the upgrade. No root is needed; Go
builds kube-apiserver and etcd (minutes cold, once; docs/real-node.md, "A control plane").
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import yaml

from shim.compat.realnode import APIError, ControlPlane, ControlPlaneError, certs
from shim.compat.realnode.apiserver import dra_flags, https_request
from shim.compat.realnode.controlplane import version_priority
from shim.compat.upstream import releases as upstream
from tests.support.control_plane import (
    APISERVERS,
    DEFAULT,
    NEWEST_DRA,
    build,
    listening,
    param,
    processes_naming,
    resource_slice,
    running,
)
from tests.support.toolchains import toolchain
from tests.support.unix import short_temp_dir

NODE_NAME_KEY = "authentication.kubernetes.io/node-name"
BY_MINOR = {r.minor: r for r in APISERVERS}


@pytest.mark.timeout(upstream.BUILD_TIMEOUT_S * 2)
def test_the_binaries_build(request: pytest.FixtureRequest) -> None:
    """First, so a cold build (minutes) has its own timeout: each release's kube-apiserver says
    it is that release (the linker's -X flags), and its etcd is the version its go.mod links."""
    for release in APISERVERS if request.config.getoption("--full-matrix") else DEFAULT:
        build(release)
        binary = release.binary(upstream.APISERVER_PROGRAM)
        done = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=60, check=True
        )
        assert done.stdout.strip() == f"Kubernetes {release.version}"
        etcd = upstream.etcd_for(release).binary()
        done = subprocess.run(
            [str(etcd), "--version"], capture_output=True, text=True, timeout=60, check=True
        )
        assert f"etcd Version: {upstream.etcd_for(release).version.removeprefix('v')}" in done.stdout


@pytest.fixture(scope="module", params=[param(r) for r in APISERVERS])
def plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    """One control plane per release for the tests that only add objects to it."""
    with running(request.param) as plane:
        yield plane


def test_serves_its_newest_dra_version_and_a_resource_slice_in_it(plane: ControlPlane) -> None:
    """The release says it is itself (/version, as its --version does), serves resource.k8s.io
    at the version the fixture promises (1.33 with its beta gate and runtime-config), and keeps a
    ResourceSlice written in that version."""
    assert plane.request("GET", "/version")["gitVersion"] == plane.release.version
    newest = NEWEST_DRA[plane.minor]
    served = plane.served_versions("resource.k8s.io")
    assert served[0] == newest, served
    path = f"/apis/resource.k8s.io/{newest}/resourceslices"
    created = plane.request("POST", path, resource_slice(newest, "slice-a", "node-a"))
    back = plane.request("GET", f"{path}/slice-a")
    assert back["metadata"]["uid"] == created["metadata"]["uid"]
    assert back["apiVersion"] == f"resource.k8s.io/{newest}"
    assert [d["name"] for d in back["spec"]["devices"]] == ["gpu-0"]
    with pytest.raises(APIError) as refused:  # the admin's client certificate is not the only way in
        plane.request("GET", path, token="not-a-token")
    assert refused.value.status == 401


def test_a_node_bound_token_names_its_node(plane: ControlPlane, tmp_path: Path) -> None:
    """A token bound to a pod on node-b carries the node's name in the user's extra, as the
    kubelet's plugins will see it; its kubeconfig loads as a client would load it."""
    token = plane.node_bound_token("dra-driver", "driver", "node-b")
    user = plane.user_info(token)
    assert user["username"] == "system:serviceaccount:dra-driver:driver"
    assert user["extra"][NODE_NAME_KEY] == ["node-b"]
    assert plane.node_bound_token("dra-driver", "driver", "node-b")  # again: everything exists
    config = yaml.safe_load(plane.kubeconfig_for_token(token, tmp_path / "driver.kubeconfig").read_text())
    assert config["users"][0]["user"] == {"token": token}
    assert config["clusters"][0]["cluster"]["server"] == plane.url
    admin = yaml.safe_load(plane.admin_kubeconfig.read_text())
    assert Path(admin["users"][0]["user"]["client-certificate"]).is_file()


def test_restart_keeps_the_data_and_stop_leaves_nothing() -> None:
    """restart() brings the same release back on the same etcd, port and data; leaving the
    block stops both daemons: no process names the folder, nothing listens on their ports."""
    release = DEFAULT[0]
    with running(release) as plane:
        plane.request("POST", "/api/v1/namespaces", {"metadata": {"name": "kept"}})
        before = plane.pids["kube-apiserver"]
        plane.restart()
        assert plane.pids["kube-apiserver"] != before
        assert plane.request("GET", "/api/v1/namespaces/kept")["metadata"]["name"] == "kept"
        folder, ports = plane.folder, [plane.port, int(plane.etcd_url.rsplit(":", 1)[1])]
        assert len(processes_naming(folder)) == 2
    assert not processes_naming(folder)
    assert not [port for port in ports if listening(port)]


@pytest.mark.full_matrix
def test_an_upgrade_from_1_33_to_1_34_keeps_a_slice_written_in_v1beta2() -> None:
    """1.34's kube-apiserver on 1.33's etcd reads, through v1, the slice 1.33 stored from v1beta2."""
    if 33 not in BY_MINOR or 34 not in BY_MINOR:
        pytest.fail("the upgrade needs the k8s-1.33 and k8s-1.34 modules' kube-apiserver")
    build(BY_MINOR[34])
    with running(BY_MINOR[33]) as plane:
        path = "/apis/resource.k8s.io/{}/resourceslices"
        created = plane.request("POST", path.format("v1beta2"), resource_slice("v1beta2", "before", "node-a"))
        plane.upgrade(34)
        assert plane.served_versions("resource.k8s.io") == ["v1"]
        assert plane.request("GET", "/version")["gitVersion"] == BY_MINOR[34].version
        back = plane.request("GET", path.format("v1") + "/before")
        assert back["metadata"]["uid"] == created["metadata"]["uid"]
        assert back["spec"]["devices"] == [{"name": "gpu-0", "attributes": {"model": {"string": "sim-gpu"}}}]


def test_a_control_plane_starts_by_hand_with_one_command() -> None:
    """`python -m shim.compat.realnode --control-plane` says where the API server and the admin's
    kubeconfig are, serves there, and on SIGTERM stops both daemons and exits 0."""
    release = DEFAULT[0]
    build(release)
    with short_temp_dir("ds-cp-") as folder:
        minor = f"1.{release.minor}"
        argv = [
            sys.executable,
            "-m",
            "shim.compat.realnode",
            "--control-plane",
            "--release",
            minor,
            "--dir",
            str(folder),
        ]
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as cli:
            assert cli.stdout is not None
            lines = [cli.stdout.readline() for _ in range(6)]
            assert lines[0].startswith("control plane up in ") and release.version in lines[0], lines
            url = next(line.split()[-1] for line in lines if "API server:" in line)
            kubeconfig = Path(next(line.split()[-1] for line in lines if "admin kubeconfig:" in line))
            user = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]
            admin = certs.KeyPair(Path(user["client-certificate"]), Path(user["client-key"]))
            assert (
                https_request(f"{url}/readyz", "GET", ca=folder / "pki" / "ca.crt", client=admin, token=None)
                == "ok"
            )
            cli.send_signal(signal.SIGTERM)
            assert cli.wait(60) == 0
        assert not processes_naming(folder)


def test_a_daemon_that_exits_is_reported_with_its_log() -> None:
    """A daemon that dies while starting fails the start at once, quoting the end of its log."""
    release = DEFAULT[0]
    build(release)

    def dying(argv: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            return subprocess.Popen(["sh", "-c", "echo 'etcd: cannot start here' >&2; exit 3"], stderr=out)

    with short_temp_dir("ds-cp-") as folder, pytest.raises(ControlPlaneError) as failed:
        ControlPlane(release.minor, folder, spawn=dying).start()
    assert "etcd exited (3) waiting for etcd healthy" in str(failed.value)
    assert "etcd: cannot start here" in str(failed.value)


# -- without daemons -----------------------------------------------------------------------------


def test_the_certificates_chain_to_the_ca_and_name_loopback(tmp_path: Path) -> None:
    toolchain("openssl", "the control plane's certificates (shim.compat.realnode.certs)")
    ca = certs.CertificateAuthority.create(tmp_path)
    server = ca.issue("server", common_name="kube-apiserver", ips=["127.0.0.1"], dns=["localhost"])
    client = ca.issue("admin", common_name="devshim-admin", organizations=["system:masters"])
    for pair, purpose in ((server, "sslserver"), (client, "sslclient")):
        verify = ["openssl", "verify", "-CAfile", str(ca.cert), "-purpose", purpose, str(pair.cert)]
        done = subprocess.run(verify, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
    text = subprocess.run(["openssl", "x509", "-noout", "-text", "-in", str(server.cert)],
                          capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "IP Address:127.0.0.1" in text and "DNS:localhost" in text
    subject = subprocess.run(["openssl", "x509", "-noout", "-subject", "-in", str(client.cert)],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "O = system:masters" in subject and "CN = devshim-admin" in subject
    assert certs.CertificateAuthority.create(tmp_path).cert.read_bytes() == ca.cert.read_bytes()  # kept


def test_dra_flags_and_version_order() -> None:
    assert dra_flags(33) == [
        "--feature-gates=DynamicResourceAllocation=true",
        "--runtime-config=resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true",
    ]
    assert dra_flags(34) == dra_flags(37) == []
    # What a 1.33 kubelet needs of a newer server: the claims' v1beta1 turned on, nothing twice.
    assert dra_flags(34, ["v1beta1"]) == ["--runtime-config=resource.k8s.io/v1beta1=true"]
    assert dra_flags(33, ["v1beta1"]) == dra_flags(33)
    # Gates on besides the defaults: one flag (a second --feature-gates would be another map).
    assert dra_flags(34, gates_on=["DRADeviceTaints"]) == ["--feature-gates=DRADeviceTaints=true"]
    assert dra_flags(33, gates_on=["DRADeviceTaints"])[0] == (
        "--feature-gates=DynamicResourceAllocation=true,DRADeviceTaints=true"
    )
    versions = ["v1alpha3", "v1beta1", "v1", "v1beta2", "v2alpha1"]
    assert sorted(versions, key=version_priority, reverse=True) == [
        "v1",
        "v1beta2",
        "v1beta1",
        "v2alpha1",
        "v1alpha3",
    ]


def test_each_apiserver_release_names_an_etcd_module() -> None:
    """Every release carrying kube-apiserver finds the etcd its go.mod links (judges/etcd-3.N)."""
    assert {r.minor: upstream.etcd_for(r).version for r in APISERVERS} == {
        33: "v3.5.21",
        34: "v3.6.4",
        37: "v3.7.0",
    }
    assert "kube-apiserver" not in {p.name for p in upstream.JUDGES.glob("etcd-*/*")}
    assert all(r.folder.name.startswith("k8s-1.") for r in upstream.releases())
