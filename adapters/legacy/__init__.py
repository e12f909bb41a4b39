"""The legacy adapter: devshim in front of an unmodified v1beta1 device plugin (README.md)."""
