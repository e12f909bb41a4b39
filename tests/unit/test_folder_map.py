"""docs/architecture.md opens with a map of the folders, one line each: held to the tree."""

from __future__ import annotations

import re

from tests.support import ROOT


def _mapped() -> list[str]:
    text = (ROOT / "docs/architecture.md").read_text(encoding="utf-8")
    block = text.split("```\n", 2)[1]  # the first code block is the map
    return [m.group(1) for line in block.splitlines() if (m := re.match(r"(\S+/) ", line))]


def _folders() -> set[str]:
    """Every package folder of src/shim and adapters; a generated tree and the Go judges count
    as one folder each (their insides are not devshim's to map)."""
    found = set()
    for top in ("src/shim", "adapters"):
        for path in [ROOT / top, *(ROOT / top).rglob("*")]:
            relative = path.relative_to(ROOT)
            inside = relative.parts[:-1]
            if not path.is_dir() or path.name == "__pycache__" or path.name.startswith("."):
                continue
            if "generated" in inside or "judges" in inside or "__pycache__" in inside:
                continue
            found.add(f"{relative}/")
    return found


def test_the_folder_map_names_every_folder_once_and_no_other() -> None:
    mapped = _mapped()
    assert len(mapped) == len(set(mapped)), "a folder is mapped twice"
    assert set(mapped) == _folders()
