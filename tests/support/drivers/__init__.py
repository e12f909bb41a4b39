"""Tiny scripted drivers for end-to-end tests, each a program of its own."""
