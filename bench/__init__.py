"""Benchmarks, run by hand: python -m bench.allocate, python -m bench.reregister (docs/benchmarks.md)."""

import os

# Quiet gRPC C-core INFO lines (a GOAWAY on every restart) before anything imports grpc.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
