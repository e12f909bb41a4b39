"""devshim: a multi-version Kubernetes device-plugin shim."""

__version__ = "0.1.0"
