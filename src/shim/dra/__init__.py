"""Dynamic Resource Allocation: drivers' devices published as ResourceSlices (docs/dra.md).

Imported only when the settings configure DRA: it brings the Kubernetes API client (kr8s).
"""
