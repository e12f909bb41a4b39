"""Extended resource names, held to the kubelet's rule (IsExtendedResourceName upstream).

devshim's settings and the names a driver declares are checked here, and drivers check their own
configurations with it too (shim.sdk.config), so a bad name is refused where it is written rather
than by the kubelet's Register, which would refuse it forever.
"""

from __future__ import annotations

from shim.facts import DNS_SUBDOMAIN_MAX, QUALIFIED_NAME, QUALIFIED_NAME_MAX, is_dns_subdomain


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
    if len("requests." + domain) > DNS_SUBDOMAIN_MAX or not is_dns_subdomain(domain):
        raise ValueError(f"{name!r}: {domain!r} is not a lowercase DNS subdomain of at most 244 characters")
    # The kubelet also checks that "requests.<name>" is a valid quota name.
    if len(short) > QUALIFIED_NAME_MAX or not QUALIFIED_NAME.fullmatch(short):
        raise ValueError(
            f"{name!r}: {short!r} must be 1-63 characters [A-Za-z0-9-_.], alphanumeric at both ends"
        )
    return name


# --- DRA (resource.k8s.io): driver names, and node names (a node's pool is named after it) ---

DRA_DRIVER_NAME_MAX = 63  # DriverNameMaxLength


def driver_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a DRA driver name (a lowercase DNS subdomain of at most 63
    characters, as the API server requires), or None."""
    if not is_dns_subdomain(name, DRA_DRIVER_NAME_MAX):
        return (
            f"{name!r} is not a DRA driver name: a lowercase DNS subdomain (gpu.example.com) "
            f"of at most {DRA_DRIVER_NAME_MAX} characters"
        )
    return None


def node_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a node's (and so its pool's) name, or None: a DNS subdomain of at
    most 253 characters."""
    if not is_dns_subdomain(name):
        return f"{name!r} is not a node name: a lowercase DNS subdomain of at most 253 characters"
    return None
