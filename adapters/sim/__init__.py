"""The simulated driver: configurable devices, grants and run-time changes."""
