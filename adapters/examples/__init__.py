"""Example drivers in Python and other languages."""
