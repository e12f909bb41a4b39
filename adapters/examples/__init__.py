"""Example drivers in Python and other languages; guide_*.py are docs/sdk.md's, run by its tests."""
