"""Property-based fuzzing of devshim's two untrusted inputs: kubelet requests and driver output."""
