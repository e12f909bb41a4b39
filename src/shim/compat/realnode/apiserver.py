"""The upstream kube-apiserver and etcd of the control plane: their command lines per release,
kubeconfig files, and a small HTTPS client for fixtures.

kube-apiserver (judges/k8s-1.NN/kube-apiserver) serves on 127.0.0.1 only, with certificates from
certs.py, `Node,RBAC` authorization and no controller-manager. DRA's resource.k8s.io is GA and
on by default from 1.34 (v1); 1.33 has it beta (newest v1beta2), off unless the
DynamicResourceAllocation gate and the beta versions are enabled. etcd (judges/etcd-3.N) keeps
its data in the control plane's folder and skips fsync: the tests never lose the machine.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from .certs import KeyPair

SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"
# Tokens name this issuer; it stays the same over restarts and upgrades, so tokens stay valid.
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
HTTP_TIMEOUT_S = 30.0
RESPONSE_LIMIT = 64 * 1024 * 1024


class APIError(RuntimeError):
    """The API server answered `status` (not 2xx); `body` is its Status object (or its text)."""

    def __init__(self, method: str, path: str, status: int, body: Any) -> None:
        message = body.get("message") if isinstance(body, dict) else body
        super().__init__(f"{method} {path}: {status} {message}")
        self.status, self.body = status, body


def dra_flags(minor: int, also: Sequence[str] = (), gates_on: Sequence[str] = ()) -> list[str]:
    """What release 1.`minor` needs to serve resource.k8s.io at its newest version, and the older
    versions ``also`` (a 1.33 kubelet reads claims through v1beta1, off by default from 1.34),
    with the feature gates ``gates_on`` turned on (DRADeviceTaints, off by default before 1.36)."""
    betas = ["v1beta1", "v1beta2"] if minor == 33 else ["v1beta1"] if minor < 34 else []
    served = list(dict.fromkeys([*betas, *also]))
    on = [*(["DynamicResourceAllocation"] if minor < 34 else []), *gates_on]
    gates = [f"--feature-gates={','.join(f'{gate}=true' for gate in on)}"] if on else []
    if not served:
        return gates  # v1, GA and enabled by default
    return [*gates, "--runtime-config=" + ",".join(f"resource.k8s.io/{v}=true" for v in served)]


def apiserver_command(
    binary: Path,
    minor: int,
    pki: Path,
    etcd_url: str,
    port: int,
    also: Sequence[str] = (),
    gates_on: Sequence[str] = (),
) -> list[str]:
    """kube-apiserver of release 1.`minor` on https://127.0.0.1:`port`, its data in `etcd_url`,
    its certificates and keys in `pki` (ca.crt, apiserver.crt/.key, service-account.key/.pub),
    serving resource.k8s.io versions ``also`` besides its default ones."""
    return [
        str(binary),
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={port}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        f"--etcd-servers={etcd_url}",
        "--authorization-mode=Node,RBAC",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-account-key-file={pki / 'service-account.pub'}",
        f"--service-account-signing-key-file={pki / 'service-account.key'}",
        f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
        # The advertised address is 127.0.0.1, which an Endpoints object may not hold.
        "--endpoint-reconciler-type=none",
        "--allow-privileged=true",
        *dra_flags(minor, also, gates_on),
        "--v=2",
    ]


def etcd_command(binary: Path, data: Path, client_port: int, peer_port: int) -> list[str]:
    """etcd, one member on loopback, its data in `data`."""
    client, peer = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
    return [
        str(binary),
        "--name=devshim",
        f"--data-dir={data}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=devshim={peer}",
        "--unsafe-no-fsync",
    ]


def write_kubeconfig(path: Path, url: str, ca: Path, user: dict[str, str]) -> Path:
    """A kubeconfig for `url` (its CA `ca`) as `user` (client-certificate/-key, or token)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "devshim", "cluster": {"server": url, "certificate-authority": str(ca)}}],
        "users": [{"name": "devshim", "user": user}],
        "contexts": [{"name": "devshim", "context": {"cluster": "devshim", "user": "devshim"}}],
        "current-context": "devshim",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


def https_request(
    url: str, method: str, *, ca: Path, client: KeyPair | None, token: str | None, body: Any = None
) -> Any:
    """The JSON the API server answers `method url` with (as `client`'s certificate, or bearer
    `token`); APIError unless it is 2xx."""
    context = ssl.create_default_context(cafile=str(ca))
    if client is not None and token is None:
        context.load_cert_chain(str(client.cert), str(client.key))
    headers = {"Accept": "application/json"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    path = url.split("/", 3)[-1]
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S, context=context) as response:
            return _decode(response.read(RESPONSE_LIMIT))
    except urllib.error.HTTPError as err:
        raise APIError(method, "/" + path, err.code, _decode(err.read(RESPONSE_LIMIT))) from None


def _decode(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")
