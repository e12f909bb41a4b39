"""The Kubernetes API, as DRA and the per-node configs (shim/nodeconfig.py) need it: the one
module that imports kr8s.

kr8s (chosen over lightkube and kubernetes_asyncio: docs/dra.md, "The API client") loads the
credentials (in-cluster service account, or a kubeconfig), keeps one HTTP/1.1 session, refreshes
expiring tokens and speaks TLS; the publisher's calls go through its ``call_api``, one path per
resource.k8s.io version, so that a version is a string here rather than a class per version.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import warnings
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import kr8s
import kr8s.asyncio

from shim.dra.http import Getter, HttpError
from shim.dra.slices import GROUP, VERSIONS
from shim.errors import ShimError

REQUEST_TIMEOUT_S = 30.0  # every call but the watch, which has its own (WATCH_TIMEOUT_S)
PAGE = 100  # slices per list page: 100 full slices of 128 devices are a few MB
WATCH_TIMEOUT_S = 240  # the API server ends a watch after this; the publisher starts another
MAX_EVENT_BYTES = 16 * 1024 * 1024  # a slice is at most ~1.5 MB (etcd's request limit)


class ApiError(ShimError):
    """The API server refused or failed a request, or could not be reached; ``http_status`` is
    its HTTP status, 0 if none (``status``, as for every ShimError, is the gRPC code)."""

    status = grpc.StatusCode.UNAVAILABLE

    def __init__(self, message: str, http_status: int = 0) -> None:
        super().__init__(message)
        self.http_status = http_status


class VersionGone(ApiError):
    """The API server no longer serves this resource.k8s.io version (it was upgraded): found
    again, and tried again (UNAVAILABLE, as every ApiError)."""


class ApiServer:
    """Calls on one API server. Every method raises ApiError (or a subclass) and nothing else."""

    def __init__(self, api: kr8s.asyncio.Api) -> None:
        self._api = api
        self._getter: Getter | None = None  # claims' reads (dra/http.py), made on the first
        self._lean = True  # False once the lean path cannot serve this server (a proxy, say)

    @classmethod
    async def connect(cls, kubeconfig: Path | None) -> ApiServer:
        """In-cluster credentials when kubeconfig is None and devshim runs in a pod, else the
        kubeconfig (None: $KUBECONFIG or ~/.kube/config)."""
        try:
            with warnings.catch_warnings():  # kr8s warns of releases newer than it knows; devshim
                warnings.simplefilter("ignore")  # speaks to them through its own version checks
                async with asyncio.timeout(REQUEST_TIMEOUT_S):  # it asks the server's version
                    api = await kr8s.asyncio.api(kubeconfig=str(kubeconfig) if kubeconfig else None)
        except TimeoutError:
            raise ApiError(f"the API server did not answer within {REQUEST_TIMEOUT_S:g} s") from None
        except httpx.TransportError as exc:
            # kr8s asks the server's version once the credentials are loaded: a failure to reach
            # it says nothing about the credentials (issue 42, 7c).
            raise ApiError(unreachable(exc)) from exc
        except Exception as exc:  # kr8s raises plain exceptions for missing or broken config
            raise ApiError(f"cannot load Kubernetes credentials: {exc}") from exc
        api.timeout = REQUEST_TIMEOUT_S  # kr8s's default is none: a server that never answers
        return cls(api)

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        base, _, rest = path.partition("/" + GROUP)
        call = self._api.call_api(method, version="", base=f"{base}/{GROUP}", url=rest.lstrip("/"), **kwargs)
        with _translated(f"{method} {path}"):
            async with call as response:
                return response.json() if response.content else None

    async def slice_versions(self) -> list[str]:
        """The versions of resource.k8s.io that serve ResourceSlices, newest first (discovery)."""
        return await self.served_versions("resourceslices")

    async def served_versions(self, resource: str) -> list[str]:
        """The versions of resource.k8s.io that serve ``resource``, newest first (discovery)."""
        group = await self._call("GET", f"/apis/{GROUP}")
        served = {v.get("version") for v in (group or {}).get("versions", ()) if isinstance(v, dict)}
        found = []
        for version in VERSIONS:
            if version not in served:
                continue
            resources = await self._call("GET", f"/apis/{GROUP}/{version}")
            if any(r.get("name") == resource for r in (resources or {}).get("resources", ())):
                found.append(version)
        return found

    async def list_slices(self, version: str, selector: str) -> tuple[list[dict[str, Any]], str]:
        """Every slice the field selector matches, and the list's resourceVersion."""
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            params = {"fieldSelector": selector, "limit": str(PAGE)} | ({"continue": token} if token else {})
            page = await self._call("GET", f"/apis/{GROUP}/{version}/resourceslices", params=params)
            items += page.get("items") or []
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return items, (page.get("metadata") or {}).get("resourceVersion", "")

    async def create_slice(self, version: str, body: dict[str, Any]) -> dict[str, Any]:
        path = f"/apis/{GROUP}/{version}/resourceslices"
        created: dict[str, Any] = await self._call("POST", path, json=body)
        return created

    async def replace_slice(self, version: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """PUT, holding body's metadata.resourceVersion: a 409 (Conflict) if it changed since."""
        path = f"/apis/{GROUP}/{version}/resourceslices/{name}"
        replaced: dict[str, Any] = await self._call("PUT", path, json=body)
        return replaced

    async def delete_slice(self, version: str, name: str, uid: str) -> None:
        """Deletes this very object (its uid), not one created since under the same name."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": uid}}
        try:
            await self._call("DELETE", f"/apis/{GROUP}/{version}/resourceslices/{name}", json=body)
        except ApiError as exc:
            if exc.http_status != 404:
                raise

    async def get_claim(self, version: str, namespace: str, name: str) -> dict[str, Any]:
        """One ResourceClaim as the API server holds it (ApiError 404 if there is none): on the
        lean path (dra/http.py), or through kr8s where that cannot (a proxy, expired
        credentials: kr8s authenticates again, and the lean path takes its new ones)."""
        path = f"/apis/{GROUP}/{version}/namespaces/{namespace}/resourceclaims/{name}"
        if self._lean:
            getter = self._getter or await self._lean_getter()
            if getter is not None:
                try:
                    response = await getter.get(path, REQUEST_TIMEOUT_S)
                except (HttpError, OSError) as exc:
                    raise ApiError(f"GET {path}: {exc}", getattr(exc, "status", 0)) from None
                except TimeoutError:
                    raise ApiError(f"GET {path}: no answer within {REQUEST_TIMEOUT_S:g} s") from None
                if response.status == 200:
                    found = _json_object(response.body)
                    if found is not None:
                        return found
                elif response.status not in (401, 403):
                    raise ApiError(
                        f"GET {path}: {response.status} {_message(response.body)}", response.status
                    )
                getter.close()  # credentials to renew (kr8s does), or an answer to read its way
                self._getter = None
        claim: dict[str, Any] = await self._call("GET", path)
        return claim

    @property
    def lean(self) -> bool:
        """Whether the last claim read took the lean path (and keeps its connection)."""
        return self._getter is not None

    async def _lean_getter(self) -> Getter | None:
        auth = self._api.auth
        if auth.proxy:
            self._lean = False
            return None
        context = await auth.ssl_context()  # type: ignore[no-untyped-call]  # kr8s's, unannotated
        headers = {"Authorization": f"Bearer {auth.token}"} if auth.token else {}
        tls = context if isinstance(context, ssl.SSLContext) else ssl.create_default_context()
        self._getter = Getter(auth.server, tls, headers | {"User-Agent": "devshim"}, auth.tls_server_name)
        return self._getter

    async def minor(self) -> int | None:
        """The API server's minor release (/version: "37" of 1.37, "37+" from some vendors); None
        where it says none devshim can read."""
        with _translated("GET /version"):
            found = await self._api.version()
        digits = str(found.get("minor", "") if isinstance(found, dict) else "").rstrip("+")
        return int(digits) if digits.isascii() and digits.isdigit() else None

    async def node_uid(self, node: str) -> str | None:
        """The Node's uid, for the slices' owner reference; None where it cannot be read."""
        try:
            async with self._api.call_api("GET", version="v1", url=f"nodes/{node}") as response:
                uid = response.json().get("metadata", {}).get("uid")
        except Exception:  # an owner reference is a courtesy, not a need
            return None
        return uid if isinstance(uid, str) else None

    async def watch_slices(
        self, version: str, selector: str, since: str
    ) -> AsyncGenerator[tuple[str, dict[str, Any]], None]:
        """(type, object) events from resourceVersion ``since`` until the API server ends the
        watch; ApiError on a failure (410 Gone: list again)."""
        params = {"fieldSelector": selector}
        async for event in self._watch(f"/apis/{GROUP}", f"{version}/resourceslices", since, params):
            yield event

    async def list_claims(self, version: str) -> tuple[list[dict[str, Any]], str]:
        """Every ResourceClaim in every namespace, and the list's resourceVersion."""
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            params = {"limit": str(PAGE)} | ({"continue": token} if token else {})
            page = await self._call("GET", f"/apis/{GROUP}/{version}/resourceclaims", params=params)
            items += page.get("items") or []
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return items, (page.get("metadata") or {}).get("resourceVersion", "")

    async def watch_claims(
        self, version: str, since: str
    ) -> AsyncGenerator[tuple[str, dict[str, Any]], None]:
        """As ``watch_slices``, for the ResourceClaims of every namespace."""
        async for event in self._watch(f"/apis/{GROUP}", f"{version}/resourceclaims", since, {}):
            yield event

    async def replace_claim_status(self, version: str, claim: dict[str, Any]) -> dict[str, Any]:
        """PUT the claim's status, holding its metadata.resourceVersion: a 409 if it changed."""
        meta = claim["metadata"]
        path = f"/apis/{GROUP}/{version}/namespaces/{meta['namespace']}/resourceclaims/{meta['name']}/status"
        replaced: dict[str, Any] = await self._call("PUT", path, json=claim)
        return replaced

    async def node_labels(self, node: str) -> tuple[dict[str, str], str]:
        """The Node's labels and the list's resourceVersion, to watch from; ApiError where the
        Node cannot be read or there is none. Its metadata alone: a Node's status (its images,
        say) is most of its size and none of devshim's business."""
        params = {"fieldSelector": f"metadata.name={node}"}
        with _translated(f"GET /api/v1/nodes/{node}"):
            async with self._api.call_api(
                "GET", version="v1", url="nodes", params=params, headers={"Accept": _METADATA_LIST}
            ) as response:
                found = response.json()
        items = found.get("items") if isinstance(found, dict) else None
        if not items:
            raise ApiError(f"there is no Node {node}", 404)
        return _labels(items[0]), str((found.get("metadata") or {}).get("resourceVersion", ""))

    async def watch_node_labels(self, node: str, since: str) -> AsyncGenerator[dict[str, str], None]:
        """The Node's labels at each change from resourceVersion ``since`` until the API server
        ends the watch (a bookmark yields nothing); ApiError on a failure (410 Gone: list again)."""
        params = {"fieldSelector": f"metadata.name={node}"}
        async for kind, obj in self._watch("/api", "v1/nodes", since, params, accept=_METADATA):
            if kind in ("ADDED", "MODIFIED"):
                yield _labels(obj)
            elif kind == "DELETED":
                yield {}

    async def _watch(
        self, base: str, url: str, since: str, params: dict[str, str], accept: str = "application/json"
    ) -> AsyncGenerator[tuple[str, dict[str, Any]], None]:
        params = params | {
            "watch": "true",
            "resourceVersion": since,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(WATCH_TIMEOUT_S),
        }
        path = f"{base}/{url}"
        with _translated(f"watch {path}"):
            async with self._api.call_api(
                "GET", version="", base=base, url=url, headers={"Accept": accept},
                params=params, stream=True, timeout=WATCH_TIMEOUT_S + 30,
            ) as response:  # fmt: skip
                async for line in response.aiter_lines():
                    if len(line) > MAX_EVENT_BYTES:
                        raise ApiError(f"watch {path}: an event of {len(line)} bytes")
                    if not line:
                        continue
                    event = json.loads(line)
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":
                        raise ApiError(f"watch {path}: {obj.get('message')}", int(obj.get("code") or 0))
                    yield kind, obj


# The API server's metadata-only answers (PartialObjectMetadata), for the Node's labels.
_METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
_METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}


@contextlib.contextmanager
def _translated(what: str) -> Iterator[None]:
    """The client's errors, as ApiError (VersionGone where the slice collection itself is gone)."""
    try:
        yield
    except kr8s.ServerError as exc:
        status = exc.response.status_code if exc.response is not None else 0
        gone = status == 404 and what.rstrip("/").endswith("resourceslices")
        raise (VersionGone if gone else ApiError)(f"{what}: {status} {exc}", status) from None
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        raise ApiError(f"{what}: {unreachable(exc)}") from None
    except (httpx.HTTPError, kr8s.APITimeoutError, OSError, json.JSONDecodeError) as exc:
        raise ApiError(f"{what}: {exc or type(exc).__name__}") from None


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        found = json.loads(body)
    except (ValueError, RecursionError):
        return None  # read again through kr8s, which says what is wrong with it
    return found if isinstance(found, dict) else None


def _message(body: bytes) -> str:
    """A Status answer's message, or the start of the body."""
    found = _json_object(body)
    message = found.get("message") if found else None
    return str(message)[:500] if message else body[:200].decode(errors="replace")


def unreachable(exc: BaseException) -> str:
    """What failed on the way to the API server, in words: httpx says "All connection attempts
    failed" and keeps the reason (refused, timed out, no such host, TLS) in its causes."""
    request = getattr(exc, "_request", None)  # httpx's .request raises where there is none
    where = f" at {request.url.scheme}://{request.url.netloc.decode()}" if request is not None else ""
    causes = [exc]
    while (cause := causes[-1].__cause__ or causes[-1].__context__) and len(causes) < 10:
        causes.append(cause)
    for cause in causes:
        if isinstance(cause, ConnectionRefusedError):
            return f"cannot reach the API server{where}: connection refused"
        if isinstance(cause, (httpx.TimeoutException, TimeoutError)):
            return f"cannot reach the API server{where}: timed out"
        if isinstance(cause, socket.gaierror):
            return f"cannot reach the API server{where}: its host name does not resolve ({cause})"
        if isinstance(cause, ssl.SSLError):
            return f"the TLS handshake with the API server{where} failed: {cause}"
    return f"cannot reach the API server{where}: {causes[-1] or type(causes[-1]).__name__}"


class ClaimReader:
    """Reads ResourceClaims in the newest resource.k8s.io version the API server serves, found
    on first use and again when a read finds nothing (the API server may have been upgraded)."""

    def __init__(
        self,
        kubeconfig: Path | None,
        connect: Callable[[Path | None], Awaitable[ApiServer]] = ApiServer.connect,
    ) -> None:
        self._kubeconfig = kubeconfig
        self._connect = connect
        self._api: ApiServer | None = None
        self._version: str | None = None

    async def __call__(self, namespace: str, name: str) -> dict[str, Any]:
        """The claim; ApiError if it cannot be read (404: there is no such claim)."""
        self._api = self._api or await self._connect(self._kubeconfig)
        for fresh in (self._version is None, True):
            if fresh:
                versions = await self._api.served_versions("resourceclaims")
                if not versions:
                    raise ApiError("the API server serves no resource.k8s.io version with ResourceClaims")
                self._version = versions[0]
            assert self._version is not None
            try:
                return await self._api.get_claim(self._version, namespace, name)
            except ApiError as exc:
                if exc.http_status != 404 or fresh:
                    raise
        raise AssertionError("unreachable: the second round is always fresh")
