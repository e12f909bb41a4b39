"""Kubernetes' facts that more than one layer of devshim needs, each defined here once.

Socket names and paths, the kubelet's deadlines and devshim's defaults inside them, and the
name rules of k8s.io/apimachinery. Every layer may import this module, the fake kubelet and the
drivers included: these are Kubernetes' facts, not devshim's code. The fake kubelet keeps its
own copy of the name rules on purpose (a judge shares no code with what it judges:
shim/compat/fakekubelet/names.py). tests/unit/test_one_truth.py fails when a second definition
of any of them appears anywhere else.
"""

from __future__ import annotations

import re
from pathlib import Path

# --- sockets (k8s.io/kubelet pkg/apis/deviceplugin/v1beta1 constants.go, podresources) ---------

KUBELET_SOCKET = "kubelet.sock"  # KubeletSocket: the kubelet's Registration, in device-plugins/
DEVICE_PLUGINS_DIR = Path("/var/lib/kubelet/device-plugins")  # DevicePluginPath
PLUGINS_REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")  # the plugin watcher's folder
PLUGINS_DIR = Path("/var/lib/kubelet/plugins")  # where DRA drivers' sockets live by convention
POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources") / KUBELET_SOCKET

# --- deadlines ---------------------------------------------------------------------------------

# The kubelet's deadline for a PreStartContainer call (KubeletPreStartContainerRPCTimeoutInSecs),
# and devshim's default for its own timeouts of a pre-start (the core's, a driver's, the legacy
# adapter's forwarding), inside it: a slow pre-start fails with devshim's reason rather than the
# kubelet's bare timeout.
KUBELET_PRESTART_DEADLINE_S = 30.0
PRESTART_TIMEOUT_S = 25.0

# How long a Register call to the kubelet may take: the kubelet dials the plugin inside Register
# and gives up after 10 s (devicemanager/plugin/v1beta1/client.go dial()), then asks for its
# options. A compatibility check waits as long for a plugin under test to register.
REGISTER_TIMEOUT_S = 15.0

# --- names (k8s.io/apimachinery pkg/util/validation) ------------------------------------------

# Used with fullmatch: a Python "$" also matches before a final newline, which Go's regexps refuse.
# Digits are [0-9], never \d: Python's \d also takes "٣", which the API server refuses.
DNS_LABEL_MAX = 63  # DNS1123LabelMaxLength
DNS_SUBDOMAIN_MAX = 253  # DNS1123SubdomainMaxLength
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_LABEL = re.compile(_LABEL)  # IsDNS1123Label, length apart
DNS_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")  # IsDNS1123Subdomain, length apart
QUALIFIED_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")  # IsQualifiedName's name part
QUALIFIED_NAME_MAX = 63


def is_dns_label(text: str) -> bool:
    return len(text) <= DNS_LABEL_MAX and DNS_LABEL.fullmatch(text) is not None


def is_dns_subdomain(text: str, max_length: int = DNS_SUBDOMAIN_MAX) -> bool:
    return len(text) <= max_length and DNS_SUBDOMAIN.fullmatch(text) is not None


def is_label_name(text: str) -> bool:
    """IsQualifiedName (a label's key, a taint's key): a name of at most 63 after an optional DNS
    subdomain and "/"."""
    prefix, slash, name = text.rpartition("/")
    if slash and not (prefix and is_dns_subdomain(prefix)):
        return False
    return len(name) <= QUALIFIED_NAME_MAX and QUALIFIED_NAME.fullmatch(name) is not None


def is_label_value(text: str) -> bool:
    """IsValidLabelValue: empty, or a name part of at most 63."""
    return not text or (len(text) <= QUALIFIED_NAME_MAX and QUALIFIED_NAME.fullmatch(text) is not None)


# semver.org 2.0.0, as the API server checks a version attribute and both ends of the driver pipe
# check each other's protocol version.
_NUMERIC = r"(0|[1-9][0-9]*)"
_PRERELEASE = r"(0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*)"
_BUILD = r"[0-9A-Za-z-]+"
SEMVER = re.compile(
    rf"{_NUMERIC}\.{_NUMERIC}\.{_NUMERIC}(-{_PRERELEASE}(\.{_PRERELEASE})*)?(\+{_BUILD}(\.{_BUILD})*)?"
)

# --- CDI names (tags.cncf.io/container-device-interface pkg/parser) ----------------------------

# A qualified CDI device name is "vendor/class=name". Vendor and class: a letter first, a letter or
# digit last, letters, digits, "_", "-" and "." between (validateVendorOrClassName). A device name:
# a letter or digit first and last, and ":" allowed too (ValidateDeviceName). ASCII only.
CDI_VENDOR_OR_CLASS = re.compile(r"[A-Za-z]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
CDI_DEVICE_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.:]*[A-Za-z0-9])?")


def cdi_kind_problem(kind: str) -> str | None:
    """Why ``kind`` is not a CDI kind "vendor/class", or None."""
    vendor, slash, device_class = kind.partition("/")
    if not slash:
        return f"{kind!r} is not a CDI kind 'vendor/class'"
    for part, what in ((vendor, "vendor"), (device_class, "class")):
        if not CDI_VENDOR_OR_CLASS.fullmatch(part):
            return (
                f"{kind!r}: the {what} {part!r} must start with a letter, end with a letter or digit, "
                "and hold only letters, digits, '_', '-' and '.'"
            )
    return None


def cdi_device_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a device of a CDI spec, or None."""
    if not CDI_DEVICE_NAME.fullmatch(name):
        return (
            f"{name!r}: a CDI device name must start and end with a letter or digit, "
            "and hold only letters, digits, '_', '-', '.' and ':'"
        )
    return None
