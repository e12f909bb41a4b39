"""`devshim --help` and each command's, as a newcomer reads them: whole sentences wrapped at word
boundaries to the terminal, real names for every value, nothing for flags, nothing cut off."""

from __future__ import annotations

import inspect
import os
import re
import subprocess

import pytest
import typer

from shim.cli import app
from tests.support.devshim_process import DEVSHIM

COMMANDS = typer.main.get_group(app)
# Wide enough for every option's name and value in one column, and narrower than the help's
# longest paragraphs, so they must wrap.
COLUMNS = 72
# A type shown where a name belongs: <bool>, <str>, <path>, <list[str]>, <float> ...
TYPE_PLACEHOLDER = re.compile(r"<[a-z][a-z\[\], ]*>")


def help_of(*command: str) -> list[str]:
    env = {**os.environ, "COLUMNS": str(COLUMNS)}
    result = subprocess.run(
        [*DEVSHIM, *command, "--help"], capture_output=True, text=True, timeout=60, env=env, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def sections(lines: list[str]) -> dict[str, list[str]]:
    """The help's parts: "Usage" (its one line), "about" (the command's docstring), and each
    titled section ("Options", "Arguments", "Commands") with its lines."""
    parts: dict[str, list[str]] = {"Usage": [lines[0]], "about": []}
    current = "about"
    for line in lines[1:]:
        if re.fullmatch(r"[A-Z][a-z]+:", line):
            current = line[:-1]
            parts[current] = []
        else:
            parts[current].append(line)
    return parts


@pytest.mark.parametrize("name", [None, *COMMANDS.commands], ids=lambda name: name or "devshim")
def test_help_wraps_whole_paragraphs_at_word_boundaries_and_names_every_value(name: str | None) -> None:
    """Each paragraph of the docstring is in the help whole, in order, broken only where the
    terminal's width makes it (a line ends only where the next word would not fit); no line is
    wider than the terminal; no option shows a type (<bool>, <str>) instead of a name; the usage
    line names the arguments as the Arguments section does."""
    command = COMMANDS if name is None else COMMANDS.commands[name]
    lines = help_of(*([name] if name else []))
    parts = sections(lines)
    assert all(len(line) <= COLUMNS for line in lines), lines

    paragraphs = "\n".join(parts["about"]).strip("\n").split("\n\n")
    expected = inspect.cleandoc(command.help or "").split("\n\n")
    # A compound's hyphen is a word boundary too ("device-" / "plugin").
    shown = [" ".join(re.sub(r"-\n\s*", "-", p).split()) for p in paragraphs]
    assert shown == [" ".join(p.split()) for p in expected]
    for paragraph in paragraphs:
        broken = paragraph.splitlines()
        for line, following in zip(broken, broken[1:], strict=False):
            next_word = following.split()[0]
            assert len(line) + 1 + len(next_word) > COLUMNS - 4, f"broken early: {line!r} / {following!r}"

    for line in parts.get("Options", []):
        assert not TYPE_PLACEHOLDER.search(line), line
    usage = parts["Usage"][0]
    assert not re.search(r"[{\[<][a-z_]+[}\]>]", usage), usage  # no lowercase Python parameter names
    for argument in parts.get("Arguments", []):
        if argument.strip():
            assert argument.split()[0] in usage, (argument, usage)


def test_the_command_list_shows_each_commands_summary_uncut() -> None:
    """`devshim --help` lists every command with a whole sentence, never one cut off with '...'."""
    listed = sections(help_of())["Commands"]
    assert {line.split()[0] for line in listed if not line.startswith("    ")} == set(COMMANDS.commands)
    assert not any(line.rstrip().endswith("...") for line in listed), listed
    summaries = " ".join(" ".join(listed).split())
    assert "run Serve the configured resources to the kubelet." in summaries
    assert "check-config Check a settings file without serving anything." in summaries


def test_flags_take_no_value_and_values_have_names() -> None:
    """Where a flag and a value option sit side by side, the flag shows nothing after its name
    and each value option a name saying what it wants."""
    options = {
        line.split()[0].rstrip(","): line.split()
        for line in sections(help_of("run"))["Options"] + sections(help_of("status"))["Options"]
        if line.startswith("  -")
    }
    assert options["--json"][1] == "Print"
    assert options["--help"][1] == "Show"
    named = {
        "--log-level": "LEVEL",
        "--log-format": "FORMAT",
        "--address": "HOST:PORT",
        "--state-dir": "DIR",
        "--driver-resource": "NAME=RESOURCE",
        "--driver-allow": "NAME=SETTING:VALUE",
    }
    for option, metavar in named.items():
        assert options[option][1] == metavar, options[option]
    assert options["-c"][1:3] == ["--config", "FILE"]
    assert options["-e"][1:3] == ["--driver-env", "NAME=KEY=VALUE"]
