"""The compatibility matrix, as a product (`devshim compat`) and as the project's own suite.

Driver side (`devshim compat --driver CMD`): a driver behind devshim, faced by the fake kubelet
(shim.compat.fakekubelet) in every mode (modes.py: kubelet behaviour profile x API versions x
registration path), through every scenario (driver_scenarios.py), each cell in a fresh world
(driver_world.py). Plugin side (`devshim compat --plugin CMD`): the kubelet's checks on any device
plugin, without devshim in front (plugin_checks.py). Results become a table, JUnit or JSON
(report.py). tests/compat/test_matrix.py runs the same scenarios, so the two cannot drift.
"""
