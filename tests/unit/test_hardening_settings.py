"""Settings of the hardening: socket mode and group, a driver's user, group and stderr limits.
Each mistake is refused when the config loads, naming the field where it is in the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shim.configfile import ConfigError
from shim.settings import DriverStderrSettings, Settings, SocketSettings

DRIVER = {"name": "d", "command": ["/bin/true"], "resources": ["example.com/d"]}


def driver(name: str, **fields: Any) -> dict[str, Any]:
    """A driver of its own resource: no two drivers may serve one."""
    return {**DRIVER, "name": name, "resources": [f"example.com/{name}"], **fields}


def load_yaml(tmp_path: Path, text: str) -> Settings:
    config = tmp_path / "devshim.yaml"
    config.write_text(text)
    return Settings.load(config)


def test_the_defaults_are_owner_only_sockets_and_bounded_driver_stderr() -> None:
    settings = Settings.load(drivers=[DRIVER])
    assert settings.socket == SocketSettings(mode=0o600, group=None)
    driver = settings.drivers[0]
    assert (driver.user, driver.group) == (None, None)
    assert driver.stderr == DriverStderrSettings(max_line_bytes=4096, max_lines_per_s=100)


@pytest.mark.parametrize(
    ("written", "mode"),
    [
        pytest.param('"0660"', 0o660, id="quoted-octal"),
        pytest.param('"0o640"', 0o640, id="python-octal"),
        pytest.param("0660", 0o660, id="yaml-1.1-octal"),
        pytest.param("384", 0o600, id="decimal-in-range"),
    ],
)
def test_a_socket_mode_is_read_as_octal(tmp_path: Path, written: str, mode: int) -> None:
    assert load_yaml(tmp_path, f"socket: {{mode: {written}}}\n").socket.mode == mode


def test_a_socket_mode_from_the_environment_is_octal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEVSHIM_SOCKET__MODE", "0660")
    assert Settings.load().socket.mode == 0o660


@pytest.mark.parametrize(
    ("socket", "fragment"),
    [
        ({"mode": 660}, r"socket.mode: .*660 is not a permission mode: write it in octal"),
        ({"mode": "0666"}, "socket.mode: .*every local user"),
        ({"mode": "0460"}, r"socket.mode: .*must let the owner read and write \(0600\)"),
        ({"mode": "rw-rw----"}, "socket.mode: .*not an octal mode"),
        ({"mode": "04660"}, "socket.mode: .*not a permission mode"),
        ({"group": "no-such-group-here"}, "socket.group: .*there is no group named 'no-such-group-here'"),
        ({"group": -1}, "socket.group: .*-1 is not a group id"),
    ],
)
def test_a_bad_socket_setting_is_refused_naming_it(socket: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        Settings.load(socket=socket)


def test_a_socket_group_may_be_a_name_or_an_id() -> None:
    assert Settings.load(socket={"group": "nogroup"}).socket.group == "nogroup"
    assert Settings.load(socket={"group": 4242}).socket.group == 4242


def test_an_unknown_driver_user_is_refused_with_its_place_in_the_file(tmp_path: Path) -> None:
    """Not at the driver's first start, where it would only show as a failing driver."""
    with pytest.raises(ConfigError) as caught:
        load_yaml(
            tmp_path,
            "drivers:\n"
            "  - {name: d, command: [/bin/true], resources: [example.com/d], user: no-such-user-here}\n",
        )
    message = str(caught.value)
    assert str(tmp_path / "devshim.yaml") in message
    assert "drivers[0].user: Value error, there is no user named 'no-such-user-here' on this node" in message


@pytest.mark.parametrize(
    ("driver", "fragment"),
    [
        ({"group": "no-such-group-here"}, r"drivers\[0\].group: .*no group named"),
        ({"user": 4_294_967_295}, r"drivers\[0\].user: .*not a user id"),
        # A uid the user database does not list has no primary group to fall back on.
        ({"user": 4242}, r"drivers\[0\]: .*user 4242 is not in this node's user database: give its group"),
        ({"stderr": {"max_line_bytes": 10}}, r"drivers\[0\].stderr.max_line_bytes"),
        ({"stderr": {"max_lines_per_s": 0}}, r"drivers\[0\].stderr.max_lines_per_s"),
    ],
)
def test_a_bad_driver_identity_or_limit_is_refused(driver: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        Settings.load(drivers=[{**DRIVER, **driver}])


def test_a_driver_user_and_group_may_be_names_or_ids() -> None:
    loaded = Settings.load(
        drivers=[
            driver("a", user="nobody"),
            driver("b", user=4242, group="4242"),
            driver("c", group="nogroup"),
        ]
    )
    assert [(d.user, d.group) for d in loaded.drivers] == [
        ("nobody", None),
        (4242, "4242"),
        (None, "nogroup"),
    ]
