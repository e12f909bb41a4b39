"""Extended resource names, held to the kubelet's rule (IsExtendedResourceName upstream).

devshim's settings and the names a driver declares are checked here, and drivers check their own
configurations with it too (shim.sdk.config), so a bad name is refused where it is written rather
than by the kubelet's Register, which would refuse it forever.
"""

from __future__ import annotations

import re

# Used with fullmatch: a Python "$" also matches before a final newline, which the kubelet's
# Go regexps refuse ("example.com/gpu\n" would pass and then fail Register forever).
_QUALIFIED_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def check_extended_resource_name(name: str) -> str:
    """Reject names the kubelet's Register would reject (IsExtendedResourceName upstream)."""
    domain, sep, short = name.partition("/")
    if not sep or not domain or not short:
        raise ValueError(f"{name!r} is not an extended resource name: expected 'vendor-domain/type'")
    if "kubernetes.io/" in name:
        raise ValueError(f"{name!r} is in the kubernetes.io namespace, which is reserved")
    if name.startswith("requests."):
        raise ValueError(f"{name!r} must not start with 'requests.' (the resource quota prefix)")
    # The kubelet checks "requests." + name as a qualified name: its domain gets that prefix.
    if len("requests." + domain) > 253 or not _DNS_SUBDOMAIN.fullmatch(domain):
        raise ValueError(f"{name!r}: {domain!r} is not a lowercase DNS subdomain of at most 244 characters")
    # The kubelet also checks that "requests.<name>" is a valid quota name.
    if len(short) > 63 or not _QUALIFIED_NAME.fullmatch(short):
        raise ValueError(
            f"{name!r}: {short!r} must be 1-63 characters [A-Za-z0-9-_.], alphanumeric at both ends"
        )
    return name


# --- DRA (resource.k8s.io): driver names, and node names (a node's pool is named after it) ---

DRA_DRIVER_NAME_MAX = 63  # DriverNameMaxLength


def driver_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a DRA driver name (a lowercase DNS subdomain of at most 63
    characters, as the API server requires), or None."""
    if len(name) > DRA_DRIVER_NAME_MAX or not _DNS_SUBDOMAIN.fullmatch(name):
        return (
            f"{name!r} is not a DRA driver name: a lowercase DNS subdomain (gpu.example.com) "
            f"of at most {DRA_DRIVER_NAME_MAX} characters"
        )
    return None


def node_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a node's (and so its pool's) name, or None: a DNS subdomain of at
    most 253 characters."""
    if not name or len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
        return f"{name!r} is not a node name: a lowercase DNS subdomain of at most 253 characters"
    return None
