"""What both front ends need from the node: the kubelet's socket folders, the plugin watcher's
registration, PodResources, and the handover between an old and a new devshim."""
