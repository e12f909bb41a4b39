"""Packaging: every package folder is installed, under the name the code imports."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
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


def test_the_wheel_ships_the_product_and_no_test_code(tmp_path: Path) -> None:
    """What `pip install .` installs: the fake kubelet and the matrix (what `devshim compat`,
    `devshim demo` and the legacy adapter run) under shim/, and nothing of tests/."""
    # Built from a copy of the tree: setuptools writes build/ and *.egg-info beside the sources,
    # and would ship any stale file an earlier build left in build/.
    tree = tmp_path / "tree"
    local = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", ".*_cache")
    shutil.copytree(ROOT, tree, ignore=local)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(tmp_path), str(tree)],
        check=True, capture_output=True,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("devshim-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names if not name.startswith("devshim-")}
    assert tops == {"shim", "devshim_adapters"}, tops
    assert "shim/compat/fakekubelet/fake_kubelet.py" in names and "shim/compat/command.py" in names
    assert not [n for n in names if "/tests/" in n or "scripted" in n or "conftest" in n]
