"""devshim: a multi-version Kubernetes device-plugin shim."""

import os

# gRPC's C core logs every peer's GOAWAY at INFO; a kubelet restart is routine, not news.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

__version__ = "0.1.0"
