"""One resource's plugin endpoint, split the way the kubelet splits its side: the decisions
(machine.py, no I/O), the plugin's gRPC server (server.py), registering with the kubelet
(client.py), and the cycle that carries the decisions out (cycle.py, ``PluginEndpoint``)."""

from shim.deviceplugin.endpoint.cycle import PluginEndpoint

__all__ = ["PluginEndpoint"]
