"""The kubelet-facing front end: per-version API modules and per-resource endpoints."""
