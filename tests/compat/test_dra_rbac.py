"""DRA, the RBAC that holds: deploy/components/dra's ServiceAccount, ClusterRole(Binding) and
ValidatingAdmissionPolicy(Binding) applied to a real kube-apiserver (RBAC on), then used with a
token of devshim's service account bound to a pod on node-a, as devshim's pod would hold it.

RBAC grants ResourceSlices cluster-wide (it cannot limit them to a node or a driver); the policy
lets the account write only the slices of the node its token names and of the DRA drivers declared
(the component declares none; applied here with deploy/overlays/dra-sim's patch declaring
gpu.example.com): node-a's slices of gpu.example.com are written, node-b's (and a slice of no
node), and node-a's of another driver, refused on create, update and delete, a token of the
account naming no node writes nothing, and other users are not matched. The token gets a
ResourceClaim in any namespace and can do nothing else to claims. `devshim run` with that token
and nothing else publishes node-a's pool, prepares a claim of it, and is refused node-b's pool
(docs/dra.md, "RBAC and the admission policy").
The newest release by default; --full-matrix adds the others (1.33: the policy read in v1beta2
and v1beta1).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from shim.compat.realnode import APIError, ControlPlane
from shim.compat.upstream import releases as upstream
from shim.generated.dra.v1 import api_pb2 as dra_v1
from tests.support import control_plane
from tests.support.control_plane import resource_slice
from tests.support.dra import (
    GPU_DRIVER,
    SIM_GPUS,
    Published,
    config,
    dra_status,
    make_claim,
    running_devshim,
)
from tests.support.unix import short_temp_dir
from tests.support.waiting import until

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
COMPONENT = DEPLOY / "components" / "dra"
# The overlay's JSON patch of the policy's declaredDrivers: applied here with GPU_DRIVER declared.
DRIVERS_PATCH = DEPLOY / "overlays" / "dra-sim" / "drivers-policy.yaml"
OTHER_DRIVER = "other.example.com"  # another vendor's driver with slices on node-a
NAMESPACE, ACCOUNT = "devshim-system", "devshim"
NODE_NAME_KEY = "authentication.kubernetes.io/node-name"
OTHER_NAMESPACE = "team-x"  # a namespace of claims, neither devshim's nor "default"
RELEASES = [control_plane.param(r) for r in control_plane.APISERVERS]
# Where each of the component's kinds is created.
COLLECTIONS = {
    "ServiceAccount": f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "ValidatingAdmissionPolicy": "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding": (
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
    ),
}
ENFORCED_TIMEOUT_S = 60.0


def component_objects() -> list[dict[str, Any]]:
    """The objects of the component's resources, as its kustomization lists them."""
    kustomization = yaml.safe_load((COMPONENT / "kustomization.yaml").read_text(encoding="utf-8"))
    return [
        doc
        for name in kustomization["resources"]
        for doc in yaml.safe_load_all((COMPONENT / name).read_text(encoding="utf-8"))
        if doc
    ]


def declaring(objects: list[dict[str, Any]], drivers: list[str]) -> list[dict[str, Any]]:
    """The objects with DRIVERS_PATCH applied to the policy as kustomize applies it (its test of
    the variable's name, then the replace), the value `drivers` instead of the overlay's."""
    (policy,) = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"]
    for op in yaml.safe_load(DRIVERS_PATCH.read_text(encoding="utf-8")):
        _, spec, variables, index, field = op["path"].split("/")
        assert (spec, variables) == ("spec", "variables"), op
        target = policy["spec"]["variables"][int(index)]
        if op["op"] == "test":
            assert target[field] == op["value"], op
        else:
            assert (op["op"], field) == ("replace", "expression"), op
            target[field] = json.dumps(drivers)
    return objects


def refused_for_driver(driver: str) -> str:
    """The policy's message when devshim writes a slice of `driver`, which it does not declare."""
    return (
        "devshim may create, update or delete only the ResourceSlices of the DRA drivers declared in "
        "its admission policy (declaredDrivers: the chart's config.dra.drivers, kustomize's "
        f"drivers-policy.yaml), not one of driver {driver}"
    )


def refused_for(node: str, other: str) -> str:
    """The policy's message when devshim on `node` writes a slice of `other` ("" for none)."""
    of = f"one of node {other}" if other else "one without spec.nodeName"
    return (
        f"devshim on node {node} may create, update or delete only the ResourceSlices of node {node}, "
        f"not {of}"
    )


NO_NODE = (
    "devshim may create, update or delete ResourceSlices only with its pod's token, which names the "
    "pod's node (authentication.kubernetes.io/node-name); this token names no node"
)


class Slices:
    """The ResourceSlice collection of one resource.k8s.io version, written as one user."""

    def __init__(self, plane: ControlPlane, version: str, token: str | None = None) -> None:
        self.plane, self.version, self.token = plane, version, token
        self.path = f"/apis/resource.k8s.io/{version}/resourceslices"

    def create(self, name: str, node: str, driver: str = GPU_DRIVER) -> dict[str, Any]:
        body = resource_slice(self.version, name, node, driver)
        return dict(self.plane.request("POST", self.path, body, self.token))

    def create_for_all_nodes(self, name: str) -> dict[str, Any]:
        body = resource_slice(self.version, name, "unused")
        del body["spec"]["nodeName"]
        body["spec"]["allNodes"] = True
        return dict(self.plane.request("POST", self.path, body, self.token))

    def update(self, current: dict[str, Any]) -> dict[str, Any]:
        """`current` written back (PUT, holding its resourceVersion) with one more label."""
        body = {**current, "metadata": {**current["metadata"], "labels": {"touched": "yes"}}}
        return dict(self.plane.request("PUT", f"{self.path}/{current['metadata']['name']}", body, self.token))

    def delete(self, name: str) -> None:
        self.plane.request("DELETE", f"{self.path}/{name}", None, self.token)

    def get(self, name: str) -> dict[str, Any]:
        return dict(self.plane.request("GET", f"{self.path}/{name}"))


def refusal(write: Callable[..., object], *args: Any) -> APIError:
    """The error `write(*args)` fails with; AssertionError if it succeeds."""
    with pytest.raises(APIError) as refused:
        write(*args)
    return refused.value


def assert_refused_by_policy(error: APIError, message: str) -> None:
    assert error.status == 403, error
    assert error.body["reason"] == "Forbidden"
    policy = "ValidatingAdmissionPolicy 'devshim-dra-node-slices' with binding 'devshim-dra-node-slices'"
    assert f"{policy} denied request: {message}" in error.body["message"], error.body["message"]


def enforced(plane: ControlPlane, token: str) -> str:
    """Once RBAC lets `token` (node-a's) write and the policy refuses it node-b's slice: the
    message of that refusal. Until then a write is either forbidden by RBAC (not yet in the
    authorizer's cache) or let through (the policy not yet loaded); what got through is removed."""
    slices = Slices(plane, control_plane.NEWEST_DRA[plane.minor], token)
    admin = Slices(plane, slices.version)
    deadline = time.monotonic() + ENFORCED_TIMEOUT_S
    last: object = None
    while time.monotonic() < deadline:
        try:
            slices.create("probe-node-b", "node-b")
        except APIError as exc:
            last = exc
            if exc.status == 403 and "ValidatingAdmissionPolicy" in str(exc):
                return str(exc)
        else:
            last = "the write went through"
            admin.delete("probe-node-b")
        time.sleep(0.1)
    raise AssertionError(f"the policy was not enforced within {ENFORCED_TIMEOUT_S:g} s; last: {last}")


@pytest.fixture(scope="module", params=RELEASES)
def plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    """A control plane with the component's RBAC and policy applied, enforced for node-a's token."""
    release: upstream.Release = request.param
    with control_plane.running(release) as running:
        running.ensure("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        for obj in declaring(component_objects(), [GPU_DRIVER]):
            running.request("POST", COLLECTIONS[obj["kind"]], obj)
        yield running


@pytest.fixture(scope="module")
def token(plane: ControlPlane) -> str:
    """devshim's token on node-a, as its pod there holds it; the policy enforced for it."""
    found = plane.node_bound_token(NAMESPACE, ACCOUNT, "node-a")
    assert plane.user_info(found)["extra"][NODE_NAME_KEY] == ["node-a"]
    enforced(plane, found)
    return found


def versions(plane: ControlPlane) -> list[str]:
    """Every resource.k8s.io version the server serves, newest first (1.33: v1beta2 and v1beta1,
    whose spec.nodeName is a plain string)."""
    served = plane.served_versions("resource.k8s.io")
    assert served[0] == control_plane.NEWEST_DRA[plane.minor] and (plane.minor != 33 or "v1beta1" in served)
    return served


def test_the_component_grants_what_the_publisher_calls_and_nothing_more() -> None:
    """The verbs of src/shim/dra/kube.py: no patch, no deletecollection, nothing but slices, the
    get of a claim and the node; the binding's subject is the account the policy matches."""
    objects = {(o["kind"], o["metadata"]["name"]): o for o in component_objects()}
    role = objects["ClusterRole", "devshim-dra"]
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): set(r["verbs"]) for r in role["rules"]}
    assert rules == {
        (("resource.k8s.io",), ("resourceslices",)): {"get", "list", "watch", "create", "update", "delete"},
        (("resource.k8s.io",), ("resourceclaims",)): {"get"},
        (("",), ("nodes",)): {"get"},
    }
    binding = objects["ClusterRoleBinding", "devshim-dra"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": NAMESPACE}]
    assert binding["roleRef"]["name"] == "devshim-dra"
    policy = objects["ValidatingAdmissionPolicy", "devshim-dra-node-slices"]
    (condition,) = policy["spec"]["matchConditions"]
    assert (
        condition["expression"]
        == f'request.userInfo.username == "system:serviceaccount:{NAMESPACE}:{ACCOUNT}"'
    )
    assert objects["ValidatingAdmissionPolicyBinding", "devshim-dra-node-slices"]["spec"] == {
        "policyName": "devshim-dra-node-slices",
        "validationActions": ["Deny"],
    }
    # Alone it declares no DRA driver: an overlay names its own (declaring(), here).
    declared = policy["spec"]["variables"][0]
    assert (declared["name"], json.loads(declared["expression"])) == ("declaredDrivers", [])


def test_the_node_bound_token_writes_its_own_nodes_slices(plane: ControlPlane, token: str) -> None:
    """Create, update, delete of node-a's slice, in every version served; and the reads the
    publisher makes (list by field selector, the Node)."""
    for version in versions(plane):
        slices = Slices(plane, version, token)
        created = slices.create(f"own-{version}", "node-a")
        assert created["spec"]["nodeName"] == "node-a"
        updated = slices.update(created)
        assert updated["metadata"]["labels"] == {"touched": "yes"}
        listed = plane.request(
            "GET", f"{slices.path}?fieldSelector=spec.driver={GPU_DRIVER},spec.nodeName=node-a", None, token
        )
        assert f"own-{version}" in [s["metadata"]["name"] for s in listed["items"]]
        slices.delete(f"own-{version}")
    assert plane.request("GET", "/api/v1/nodes/node-a", None, token)["metadata"]["name"] == "node-a"


def test_another_nodes_slice_is_refused_on_create_update_and_delete(plane: ControlPlane, token: str) -> None:
    """node-b's slice, created by the admin, cannot be created, updated or deleted with node-a's
    token, in any version served; the message names both nodes. The admin's slice is intact."""
    message = refused_for("node-a", "node-b")
    for version in versions(plane):
        admin, slices = Slices(plane, version), Slices(plane, version, token)
        name = f"theirs-{version}"
        theirs = admin.create(name, "node-b")
        assert_refused_by_policy(refusal(slices.create, f"mine-{version}", "node-b"), message)
        assert_refused_by_policy(refusal(slices.update, theirs), message)
        assert_refused_by_policy(refusal(slices.delete, name), message)
        assert admin.get(name)["metadata"]["resourceVersion"] == theirs["metadata"]["resourceVersion"]
        admin.delete(name)


def test_another_drivers_slice_on_its_own_node_is_refused_on_create_update_and_delete(
    plane: ControlPlane, token: str
) -> None:
    """Another vendor's slice on node-a, created by the admin, cannot be created, updated or
    deleted with node-a's token, in any version served (on delete the policy reads the old
    object); the message names the driver. The admin's slice is intact. The declared driver's
    slice on node-a is written (test_the_node_bound_token_writes_its_own_nodes_slices)."""
    message = refused_for_driver(OTHER_DRIVER)
    for version in versions(plane):
        admin, slices = Slices(plane, version), Slices(plane, version, token)
        name = f"vendor-{version}"
        theirs = admin.create(name, "node-a", OTHER_DRIVER)
        assert_refused_by_policy(refusal(slices.create, f"forged-{version}", "node-a", OTHER_DRIVER), message)
        assert_refused_by_policy(refusal(slices.update, theirs), message)
        assert_refused_by_policy(refusal(slices.delete, name), message)
        assert admin.get(name)["metadata"]["resourceVersion"] == theirs["metadata"]["resourceVersion"]
        admin.delete(name)


async def test_a_policy_declaring_no_driver_refuses_every_write(plane: ControlPlane, token: str) -> None:
    """The component as shipped declares none (`[]`, which the server must type-check): node-a's
    slice of gpu.example.com is then refused with the driver's message. The declaration is put
    back after, and written through again."""
    path = f"{COLLECTIONS['ValidatingAdmissionPolicy']}/devshim-dra-node-slices"
    slices = Slices(plane, control_plane.NEWEST_DRA[plane.minor], token)
    admin = Slices(plane, slices.version)

    def declare(expression: str) -> None:
        policy = plane.request("GET", path)
        policy["spec"]["variables"][0]["expression"] = expression
        plane.request("PUT", path, policy)

    def write() -> str:
        """Node-a's slice of GPU_DRIVER written (and removed): "written", else the refusal."""
        try:
            slices.create("probe-undeclared", "node-a")
        except APIError as exc:
            return str(exc)
        admin.delete("probe-undeclared")
        return "written"

    declare("[]")
    try:
        await until(
            lambda: refused_for_driver(GPU_DRIVER) in write(), "no driver declared", ENFORCED_TIMEOUT_S
        )
    finally:
        declare(json.dumps([GPU_DRIVER]))
    await until(lambda: write() == "written", "the declaration is back in force", ENFORCED_TIMEOUT_S)


def test_a_slice_of_no_node_is_refused(plane: ControlPlane, token: str) -> None:
    """A slice for all nodes has no spec.nodeName (in any version): not the token's node."""
    for version in versions(plane):
        slices = Slices(plane, version, token)
        error = refusal(slices.create_for_all_nodes, f"all-{version}")
        assert_refused_by_policy(error, refused_for("node-a", ""))


def test_a_token_of_the_account_naming_no_node_writes_nothing(plane: ControlPlane, token: str) -> None:
    """A TokenRequest bound to no pod: the same account, the same RBAC, no node in its extra."""
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600},
    }
    found = plane.request("POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{ACCOUNT}/token", request)
    unbound = str(found["status"]["token"])
    user = plane.user_info(unbound)
    assert user["username"] == f"system:serviceaccount:{NAMESPACE}:{ACCOUNT}"
    assert NODE_NAME_KEY not in user.get("extra", {})
    slices = Slices(plane, control_plane.NEWEST_DRA[plane.minor], unbound)
    assert_refused_by_policy(refusal(slices.create, "unbound-a", "node-a"), NO_NODE)
    admin = Slices(plane, slices.version)
    theirs = admin.create("unbound-theirs", "node-a")
    assert_refused_by_policy(refusal(slices.update, theirs), NO_NODE)
    assert_refused_by_policy(refusal(slices.delete, "unbound-theirs"), NO_NODE)
    admin.delete("unbound-theirs")


def test_other_users_are_not_matched(plane: ControlPlane, token: str) -> None:
    """The admin writes any node's slice; so does another service account with the same
    ClusterRole and a token bound to node-a: the policy matches devshim's account only."""
    version = control_plane.NEWEST_DRA[plane.minor]
    admin = Slices(plane, version)
    created = admin.create("admin-b", "node-b")
    admin.update(created)
    admin.delete("admin-b")
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "other-dra"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "devshim-dra"},
        "subjects": [{"kind": "ServiceAccount", "name": "other", "namespace": NAMESPACE}],
    }
    plane.ensure(COLLECTIONS["ClusterRoleBinding"], binding)
    other = Slices(plane, version, plane.node_bound_token(NAMESPACE, "other", "node-a"))
    deadline = time.monotonic() + ENFORCED_TIMEOUT_S
    while True:  # until RBAC's cache has the new binding
        try:
            other.create("other-b", "node-b")
            break
        except APIError as exc:
            if exc.status != 403 or "ValidatingAdmissionPolicy" in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    other.delete("other-b")


def claim_version(plane: ControlPlane) -> str:
    """The version claims are made in here: v1, or on 1.33 v1beta1 (make_claim's two shapes)."""
    return "v1" if "v1" in versions(plane) else "v1beta1"


def claims(version: str, namespace: str | None) -> str:
    """The ResourceClaim collection of ``namespace`` (None: of every namespace)."""
    where = f"namespaces/{namespace}/" if namespace else ""
    return f"/apis/resource.k8s.io/{version}/{where}resourceclaims"


def assert_refused_by_rbac(error: APIError, verb: str, resource: str = "resourceclaims") -> None:
    assert error.status == 403, error
    expected = f'cannot {verb} resource "{resource}" in API group "resource.k8s.io"'
    assert expected in error.body["message"] and "ValidatingAdmissionPolicy" not in str(error), error


def test_the_node_bound_token_gets_a_claim_in_any_namespace(plane: ControlPlane, token: str) -> None:
    """NodePrepareResources reads each claim the kubelet names by one GET (src/shim/dra/kube.py),
    in whichever namespace the pod is: the token gets a claim in "default" and in another
    namespace, in every version served. RBAC cannot narrow it to the node's claims."""
    plane.ensure("/api/v1/namespaces", {"metadata": {"name": OTHER_NAMESPACE}})
    for namespace in ("default", OTHER_NAMESPACE):
        made = make_claim(plane, claim_version(plane), "readable", [("gpus", "gpu-0")], node="node-a",
                          namespace=namespace)  # fmt: skip
        for version in versions(plane):
            got = plane.request("GET", f"{claims(version, namespace)}/readable", None, token)
            assert got["metadata"]["uid"] == made["metadata"]["uid"]
            assert got["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"


def test_the_node_bound_token_can_do_nothing_else_to_claims(plane: ControlPlane, token: str) -> None:
    """Only get is granted: list (in a namespace or across all), watch, create, update (the claim
    or its status), delete and deletecollection are each refused by RBAC, and the claim is
    intact after."""
    plane.ensure("/api/v1/namespaces", {"metadata": {"name": OTHER_NAMESPACE}})
    version = claim_version(plane)
    claim = make_claim(plane, version, "untouchable", [("gpus", "gpu-1")], node="node-a",
                       namespace=OTHER_NAMESPACE)  # fmt: skip
    path = claims(version, OTHER_NAMESPACE)
    forged = {
        "apiVersion": claim["apiVersion"],
        "kind": "ResourceClaim",
        "metadata": {"name": "forged"},
        "spec": claim["spec"],
    }
    relabelled = {**claim, "metadata": {**claim["metadata"], "labels": {"touched": "yes"}}}
    attempts: list[tuple[str, str, str, str, Any]] = [
        ("list", "resourceclaims", "GET", path, None),
        ("list", "resourceclaims", "GET", claims(version, None), None),
        # timeoutSeconds: were the watch let through, it would end by itself rather than hang
        ("watch", "resourceclaims", "GET", f"{path}?watch=true&timeoutSeconds=1", None),
        ("create", "resourceclaims", "POST", path, forged),
        ("update", "resourceclaims", "PUT", f"{path}/untouchable", relabelled),
        ("update", "resourceclaims/status", "PUT", f"{path}/untouchable/status", relabelled),
        ("delete", "resourceclaims", "DELETE", f"{path}/untouchable", None),
        ("deletecollection", "resourceclaims", "DELETE", path, None),
    ]
    for verb, resource, method, url, body in attempts:
        assert_refused_by_rbac(refusal(plane.request, method, url, body, token), verb, resource)
    after = plane.request("GET", f"{path}/untouchable")
    assert after["metadata"]["resourceVersion"] == claim["metadata"]["resourceVersion"]
    assert "labels" not in after["metadata"]


async def test_devshim_publishes_its_nodes_pool_with_this_rbac_alone(plane: ControlPlane, token: str) -> None:
    """`devshim run` with node-a's token (no admin rights) publishes node-a's pool: the verbs
    suffice (discovery, list, watch, create, the Node's uid for the owner reference)."""
    version = control_plane.NEWEST_DRA[plane.minor]
    with short_temp_dir("ds-rbac-") as folder:
        kubeconfig = plane.kubeconfig_for_token(token, folder / "devshim.kubeconfig")
        published = Published(plane, version, "node-a")
        configured = config(folder, plane, "node-a", SIM_GPUS, kubeconfig=kubeconfig)
        async with running_devshim(configured) as (_, port):
            await published.until(lambda p: len(p) == 4, "node-a's four GPUs are published")
            status = await dra_status(port, lambda s: s[GPU_DRIVER]["slices"] == 1, "published")
        [item] = published.slices()
    assert status[GPU_DRIVER]["last_error"] is None
    node = plane.request("GET", "/api/v1/nodes/node-a")
    assert item["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]


async def test_devshim_configured_for_another_node_is_refused(plane: ControlPlane, token: str) -> None:
    """The same token, devshim told it is node-b: every create is refused, /status says why,
    and nothing of node-b's is published."""
    version = control_plane.NEWEST_DRA[plane.minor]
    with short_temp_dir("ds-rbac-") as folder:
        kubeconfig = plane.kubeconfig_for_token(token, folder / "devshim.kubeconfig")
        configured = config(folder, plane, "node-b", SIM_GPUS, kubeconfig=kubeconfig)
        async with running_devshim(configured) as (_, port):
            status = await dra_status(
                port, lambda s: bool(s[GPU_DRIVER]["last_error"]), "the publisher reports a refusal"
            )
        assert not Published(plane, version, "node-b").slices()
    error = status[GPU_DRIVER]["last_error"]
    assert "403" in error and refused_for("node-a", "node-b") in error, error
    assert status[GPU_DRIVER]["slices"] == 0 and status[GPU_DRIVER]["writes"] == 0


async def test_devshim_prepares_a_claim_with_this_rbac_alone(plane: ControlPlane, token: str) -> None:
    """`devshim run` with node-a's token (no admin rights), called as the kubelet calls its DRA
    socket: NodePrepareResources for a claim of node-a's pool in a namespace of its own reads the
    claim (discovery, one GET) and answers its device. Every socket, spec and checkpoint stays in
    the test's folder (config() sets plugins_registry_dir, dra.plugins_dir, dra.cdi_dir and
    state_dir there), never under /var/lib/kubelet."""
    plane.ensure("/api/v1/namespaces", {"metadata": {"name": OTHER_NAMESPACE}})
    claim = make_claim(plane, claim_version(plane), "prepared", [("gpus", "gpu-2")], node="node-a",
                       namespace=OTHER_NAMESPACE)  # fmt: skip
    uid = claim["metadata"]["uid"]
    with short_temp_dir("ds-rbac-") as folder:
        kubeconfig = plane.kubeconfig_for_token(token, folder / "devshim.kubeconfig")
        configured = config(folder, plane, "node-a", SIM_GPUS, kubeconfig=kubeconfig)
        socket = folder / "plugins" / GPU_DRIVER / "dra.sock"
        async with running_devshim(configured) as (_, port):
            await dra_status(port, lambda s: bool(s[GPU_DRIVER]["devices"]), "the DRA driver serves its pool")
            await until(socket.exists, "the DRA socket is there")
            request = dra_v1.NodePrepareResourcesRequest(
                claims=[dra_v1.Claim(namespace=OTHER_NAMESPACE, name="prepared", uid=uid)]
            )
            service = dra_v1.DESCRIPTOR.services_by_name["DRAPlugin"].full_name
            async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
                call = channel.unary_unary(f"/{service}/NodePrepareResources", None, None)
                raw = await call(request.SerializeToString(), timeout=60)
        answer = dra_v1.NodePrepareResourcesResponse.FromString(raw).claims[uid]
        assert answer.error == ""
        assert [(d.pool_name, d.device_name) for d in answer.devices] == [("node-a", "gpu-2")]
        # The sim grants no container edits, so there is no CDI spec; the checkpoint holds the claim.
        assert uid in (folder / "state" / "dra" / f"{GPU_DRIVER}.json").read_text()


# -- binding conditions: the extra rules docs/dra.md gives ---------------------------------------

BINDING_RBAC = re.compile(r"^```yaml binding-rbac\n(.*?)^```", re.MULTILINE | re.DOTALL)
ATTACHED, FAILED = "gpu.example.com/attached", "gpu.example.com/attach-failed"
COPIED = {"bindingConditions": [ATTACHED], "bindingFailureConditions": [FAILED]}
GRANULAR_SINCE = 36  # DRAResourceClaimGranularStatusAuthorization: beta and on in 1.36


def binding_rules() -> list[dict[str, Any]]:
    found = BINDING_RBAC.search((DEPLOY.parent / "docs" / "dra.md").read_text(encoding="utf-8"))
    assert found is not None, "docs/dra.md lost its ```yaml binding-rbac block"
    rules: list[dict[str, Any]] = yaml.safe_load(found.group(1))
    return rules


def with_binding_rules(plane: ControlPlane, token: str) -> None:
    """docs/dra.md's binding-conditions rules granted to devshim's account (idempotent), once the
    authorizer lets the token list claims."""
    name = "devshim-dra-binding"
    plane.ensure(COLLECTIONS["ClusterRole"], {"metadata": {"name": name}, "rules": binding_rules()})
    plane.ensure(COLLECTIONS["ClusterRoleBinding"], {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": NAMESPACE}],
    })  # fmt: skip

    def listed() -> bool:
        try:
            plane.request("GET", claims("v1", None), None, token)
        except APIError:
            return False
        return True

    deadline = time.monotonic() + ENFORCED_TIMEOUT_S
    while not listed():
        assert time.monotonic() < deadline, "the binding rules were not in force in time"
        time.sleep(0.1)


def conditions(plane: ControlPlane, namespace: str, name: str) -> list[dict[str, Any]]:
    devices = plane.request("GET", f"{claims('v1', namespace)}/{name}").get("status", {}).get("devices") or []
    return [c for d in devices for c in d.get("conditions") or ()]


async def test_devshim_answers_binding_conditions_with_the_documented_rules_alone(
    plane: ControlPlane, token: str
) -> None:
    """`devshim run` with node-a's token and docs/dra.md's extra rules: a claim allocated on node-a
    from its pool gets the driver's answer in status.devices (the watch, the status update and,
    from 1.36, resourceclaims/driver's associated-node:update suffice); the same token cannot
    write the conditions of a claim allocated on node-b."""
    if plane.minor < GRANULAR_SINCE:
        pytest.skip(f"binding conditions are off by default before 1.{GRANULAR_SINCE}")
    with_binding_rules(plane, token)
    plane.ensure("/api/v1/namespaces", {"metadata": {"name": OTHER_NAMESPACE}})
    mine = make_claim(plane, "v1", "attach-a", [("gpus", "gpu-0")], node="node-a", namespace=OTHER_NAMESPACE,
                      binding=COPIED)  # fmt: skip
    binding = {"conditions": [ATTACHED], "failure_conditions": [FAILED]}
    sim = SIM_GPUS | {"attach": True, "devices": [{"id": "gpu-0", "binding": binding}, {"id": "gpu-1"}]}
    with short_temp_dir("ds-rbac-") as folder:
        kubeconfig = plane.kubeconfig_for_token(token, folder / "devshim.kubeconfig")
        configured = config(folder, plane, "node-a", sim, kubeconfig=kubeconfig)
        settings = yaml.safe_load(configured.read_text())
        settings["dra"]["drivers"][0]["binding_conditions"] = True
        configured.write_text(yaml.safe_dump(settings))
        async with running_devshim(configured) as (_, port):
            status = await dra_status(port, lambda s: s[GPU_DRIVER]["binding"]["attached"] == 1, "answered")
    assert status[GPU_DRIVER]["binding"]["last_error"] is None
    said = conditions(plane, OTHER_NAMESPACE, "attach-a")
    assert [(c["type"], c["status"]) for c in said] == [(ATTACHED, "True")]
    assert mine["metadata"]["uid"]
    # node-b's claim: devshim on node-a may not write its devices' conditions.
    theirs = make_claim(plane, "v1", "attach-b", [("gpus", "gpu-0")], node="node-b",
                        namespace=OTHER_NAMESPACE, binding=COPIED)  # fmt: skip
    entry = {"driver": GPU_DRIVER, "pool": "node-b", "device": "gpu-0", "conditions": [
        {"type": ATTACHED, "status": "True", "reason": "Forged", "message": "",
         "lastTransitionTime": "2026-01-01T00:00:00Z"}]}  # fmt: skip
    forged = {**theirs, "status": {**theirs["status"], "devices": [entry]}}
    path = f"{claims('v1', OTHER_NAMESPACE)}/attach-b/status"
    error = refusal(plane.request, "PUT", path, forged, token)
    # A Forbidden field of the update (pkg/registry/resource: AuthorizedForDeviceStatus), so 422.
    refused = 'cannot arbitrary-node:update resource "resourceclaims/driver"'
    assert error.status == 422 and refused in error.body["message"], error
    assert conditions(plane, OTHER_NAMESPACE, "attach-b") == []
