"""Packaging: every package folder is installed, under the name the code imports."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_folder_is_listed_in_pyproject() -> None:
    """pyproject.toml lists packages explicitly (adapters/ installs as devshim_adapters);
    a new package folder left out of that list would be missing from every install."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = set()
    for prefix, folder in config["package-dir"].items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            parts = init.parent.relative_to(base).parts
            name = ".".join(((prefix,) if prefix else ()) + parts)
            if "__pycache__" not in parts and name:
                found.add(name)
    assert not found - listed, f"package folders missing from pyproject.toml: {sorted(found - listed)}"
    assert not listed - found, f"pyproject.toml lists packages with no folder: {sorted(listed - found)}"
