"""devshim drivers: each a program of its own speaking the driver protocol (docs/driver-protocol.md)."""
