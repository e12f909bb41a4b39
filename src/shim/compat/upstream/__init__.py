"""The upstream judge: the kubelet's own device manager, at several releases, as the kubelet.

`devshim compat --judge upstream-1.NN` runs the driver scenarios and the plugin checks with
k8s.io/kubernetes's pkg/kubelet/cm/devicemanager (and its plugin manager, for the watcher path)
in place of the fake kubelet. The Go harness that wraps it lives in judges/ (one module per
release, built on first use into a cache: releases.py); harness.py drives one over stdin and
stdout; world.py and scenarios.py are the driver matrix's world and rows as the real manager
sees them; plugin_checks.py the plugin checks.
"""
