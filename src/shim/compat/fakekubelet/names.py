"""Validation of resource names, as the kubelet does on Register.

Mirrors IsExtendedResourceName in pkg/apis/core/v1/helper/helpers.go (called from
pkg/kubelet/cm/devicemanager/plugin/v1beta1/server.go Register): the name must be
"domain/name", outside the kubernetes.io namespace, and valid as a qualified name once prefixed
with "requests." (the resource quota spelling).
"""

from __future__ import annotations

import re

_DEFAULT_NAMESPACE_PREFIX = "kubernetes.io/"  # core/v1 ResourceDefaultNamespacePrefix
_QUOTA_PREFIX = "requests."  # core/v1 DefaultResourceRequestsPrefix

# k8s.io/apimachinery/pkg/util/validation: IsQualifiedName and IsDNS1123Subdomain.
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_QUALIFIED_NAME_MAX = 63
_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*")
_DNS1123_SUBDOMAIN_MAX = 253


def is_extended_resource_name(name: str) -> bool:
    """True when the kubelet would accept `name` as a device plugin's resource name."""
    # helpers.go IsNativeResource: unprefixed names and anything under kubernetes.io/ are native.
    if "/" not in name or _DEFAULT_NAMESPACE_PREFIX in name:
        return False
    if name.startswith(_QUOTA_PREFIX):
        return False
    return _is_qualified_name(_QUOTA_PREFIX + name)


def _is_qualified_name(value: str) -> bool:
    parts = value.split("/")
    if len(parts) == 1:
        prefix, name = None, parts[0]
    elif len(parts) == 2:
        prefix, name = parts
    else:
        return False
    if prefix is not None and not _is_dns1123_subdomain(prefix):
        return False
    return 0 < len(name) <= _QUALIFIED_NAME_MAX and _QUALIFIED_NAME.fullmatch(name) is not None


def _is_dns1123_subdomain(value: str) -> bool:
    return 0 < len(value) <= _DNS1123_SUBDOMAIN_MAX and _DNS1123_SUBDOMAIN.fullmatch(value) is not None
