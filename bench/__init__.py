"""Benchmarks, run by hand: python -m bench [--quick] [--rows ...] [--json FILE] (docs/benchmarks.md)."""

import os

# Quiet gRPC C-core INFO lines (a GOAWAY on every restart) before anything imports grpc.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
