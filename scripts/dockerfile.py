"""The Dockerfile as data, and the build context `docker build .` sends, for building the image
without Docker (scripts/build_image.py) and for the tests that check that build against the
Dockerfile (tests/deploy/test_dockerfile.py, tests/deploy/test_image.py).

The builder reads its steps from here rather than keeping its own list, so the Dockerfile stays
the one recipe: an instruction this parser does not know is an error, never skipped.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
# What Docker's image config says when a base image sets no PATH (Debian's images set only this).
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
KNOWN = {"FROM", "ENV", "WORKDIR", "COPY", "RUN", "LABEL", "USER", "EXPOSE", "ENTRYPOINT", "CMD"}


class DockerfileError(ValueError):
    """An instruction or form the no-Docker build does not implement."""


@dataclass
class Stage:
    """One FROM ... [AS name] and its instructions, as (KEYWORD, arguments) in order."""

    base: str
    name: str
    steps: list[tuple[str, str]] = field(default_factory=list)


def instructions(text: str) -> list[tuple[str, str]]:
    """Every instruction as (KEYWORD, arguments): comments dropped, continuation lines joined."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n\s*", " ", "\n".join(lines))
    found = []
    for line in filter(None, (line.strip() for line in joined.splitlines())):
        keyword, _, args = line.partition(" ")
        if keyword.upper() not in KNOWN:
            raise DockerfileError(f"Dockerfile: {keyword} is not implemented by scripts/build_image.py")
        found.append((keyword.upper(), args.strip()))
    return found


def stages(text: str) -> list[Stage]:
    """The Dockerfile's stages in order; an unnamed stage is named by its index, as Docker does."""
    found: list[Stage] = []
    for keyword, args in instructions(text):
        if keyword == "FROM":
            words = args.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else str(len(found))
            found.append(Stage(words[0], name))
        elif not found:
            raise DockerfileError(f"Dockerfile: {keyword} before any FROM")
        else:
            found[-1].steps.append((keyword, args))
    return found


def assignments(args: str) -> dict[str, str]:
    """ENV's or LABEL's key=value pairs (values quoted as the shell would)."""
    pairs = {}
    for word in shlex.split(args):
        key, sep, value = word.partition("=")
        if not sep:
            raise DockerfileError(f"Dockerfile: only the key=value form is implemented ({args!r})")
        pairs[key] = value
    return pairs


def expand(value: str, env: dict[str, str]) -> str:
    """${NAME} and $NAME as Docker expands them in ENV, from the variables set so far."""
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env.get(m.group(1) or m.group(2), ""), value)


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        raise DockerfileError(f"Dockerfile: ENTRYPOINT and CMD take the exec (JSON) form ({args!r})")
    return value


# --- the build context: .dockerignore ---------------------------------------------------------


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as a regex: ``**`` spans directories, ``*`` and ``?`` do not."""
    if "[" in pattern or "\\" in pattern:
        raise ValueError(f".dockerignore pattern {pattern!r}: character classes are not emulated here")
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        else:
            out += {"*": "[^/]*", "?": "[^/]"}.get(pattern[i], re.escape(pattern[i]))
            i += 1
    return re.compile(out)


class DockerIgnore:
    """Docker's rule: the last pattern matching a path or one of its parent directories
    decides; a ``!`` pattern re-includes."""

    def __init__(self, text: str) -> None:
        lines = [line.strip() for line in text.splitlines()]
        self.rules: list[tuple[bool, re.Pattern[str]]] = []
        self.exceptions: list[str] = []
        for line in filter(None, lines):
            if line.startswith("#"):
                continue
            include = line.startswith("!")
            pattern = os.path.normpath(line.removeprefix("!").lstrip("/"))
            self.rules.append((include, _glob_regex(pattern)))
            if include:
                self.exceptions.append(pattern)

    def excluded(self, rel: str) -> bool:
        parts = rel.split("/")
        prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
        excluded = False
        for include, regex in self.rules:
            if any(regex.fullmatch(prefix) for prefix in prefixes):
                excluded = not include
        return excluded

    def may_reinclude_below(self, rel: str) -> bool:
        return any(pattern.startswith(rel + "/") for pattern in self.exceptions)


def context_files(root: Path = ROOT) -> list[str]:
    """The files `docker build` would send from `root`, relative and sorted."""
    ignore = DockerIgnore((root / ".dockerignore").read_text(encoding="utf-8"))
    found = []
    for folder, dirs, files in os.walk(root):
        rel_dir = os.path.relpath(folder, root)
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        dirs[:] = [
            d for d in dirs if not ignore.excluded(rel_dir + d) or ignore.may_reinclude_below(rel_dir + d)
        ]
        found += [rel_dir + name for name in files if not ignore.excluded(rel_dir + name)]
    return sorted(found)


def copy_build_context(dest: Path, root: Path = ROOT) -> list[str]:
    """Copy what `docker build .` would send; return the top-level entries copied."""
    for rel in context_files(root):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, dest / rel)
    return sorted(p.name for p in dest.iterdir())
