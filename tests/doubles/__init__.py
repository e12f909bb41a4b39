"""Test doubles of the plugin's side, for testing the fake kubelet (src/shim/kubelet) itself."""
