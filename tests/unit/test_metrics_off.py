"""devshim's metrics are defined only when its ops endpoint serves them (shim/ops/metrics.py):
what `devshim run` with `http.enabled: false` pays is no prometheus_client (issue 31)."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
from shim.ops import metrics
import shim.cli, shim.runtime
metrics.registration("example.com/a", "v1beta1", ok=True)
metrics.negotiated("example.com/a", "v1beta1")
metrics.devices("example.com/a", 2, 1)
metrics.rpc_requests("example.com/a", "v1beta1", "Allocate", "OK").inc()
metrics.rpc_duration("example.com/a", "v1beta1", "Allocate").observe(0.001)
print("prometheus_client" in sys.modules)
metrics.enable()
metrics.registration("example.com/a", "v1beta1", ok=True)
metrics.devices("example.com/a", 2, 1)
from shim.ops.series import REGISTRY
print(REGISTRY.get_sample_value(
    "devshim_registrations_total", {"resource": "example.com/a", "version": "v1beta1", "outcome": "ok"}
))
print(REGISTRY.get_sample_value("devshim_devices", {"resource": "example.com/a", "health": "Unhealthy"}))
"""


def test_recorders_do_nothing_and_load_nothing_until_enabled_then_count() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    # Off: every recorder answered, nothing loaded; on: only what came after enable() counted.
    assert done.stdout.split() == ["False", "1.0", "1.0"]
