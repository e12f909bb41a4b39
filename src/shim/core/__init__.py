"""The version-neutral core: one ResourceService per extended resource."""

from shim.core.resource import ResourceService

__all__ = ["ResourceService"]
