"""Settings: every bad input is refused with a message naming the field; nothing starts."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from shim.configfile import ConfigError
from shim.names import check_extended_resource_name
from shim.settings import Settings, default_socket_name, environment


def static(count: int = 2) -> dict[str, object]:
    return {"static": {"count": count}}


def test_a_minimal_resource_gets_upstream_defaults() -> None:
    """Defaults follow upstream: /var/lib/kubelet/device-plugins and kubelet.sock in it."""
    settings = Settings.load(resources=[{"name": "example.com/foo", **static()}])
    assert settings.device_plugins_dir == Path("/var/lib/kubelet/device-plugins")
    assert settings.kubelet_socket == Path("/var/lib/kubelet/device-plugins/kubelet.sock")
    assert settings.resources[0].socket_name is None  # devshim names it per instance:
    assert default_socket_name("example.com/foo", "0a1b2c") == "devshim-example.com_foo-0a1b2c.sock"


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        pytest.param("foo", "expected 'vendor-domain/type'", id="no-domain"),
        pytest.param("kubernetes.io/foo", "reserved", id="kubernetes-io"),
        pytest.param("node.kubernetes.io/foo", "reserved", id="kubernetes-io-subdomain"),
        pytest.param("Example.com/foo", "DNS subdomain", id="uppercase-domain"),
        pytest.param("example.com/-foo", "alphanumeric at both ends", id="bad-short-name"),
        pytest.param("example.com/" + "x" * 64, "1-63 characters", id="too-long"),
        pytest.param("example.com/", "expected 'vendor-domain/type'", id="empty-type"),
    ],
)
def test_names_the_kubelet_would_refuse_are_refused(name: str, fragment: str) -> None:
    """The kubelet's Register rejects non-extended resource names; devshim refuses them up front."""
    with pytest.raises(ValueError, match=fragment):
        check_extended_resource_name(name)


def test_a_valid_extended_resource_name_passes() -> None:
    """Names like nvidia.com/gpu are accepted unchanged."""
    assert check_extended_resource_name("nvidia.com/gpu") == "nvidia.com/gpu"


@pytest.mark.parametrize(
    ("resources", "fragment"),
    [
        pytest.param(
            [{"name": "example.com/a", "static": {}}], "exactly one of 'count' or 'devices'", id="none"
        ),
        pytest.param(
            [{"name": "example.com/a", "static": {"count": 1, "devices": [{"id": "x"}]}}],
            "exactly one",
            id="both",
        ),
        pytest.param(
            [{"name": "example.com/a", "static": {"devices": [{"id": "x"}, {"id": "x"}]}}],
            "appears twice",
            id="duplicate-id",
        ),
        pytest.param(
            [{"name": "example.com/a", **static()}] * 2, "configured twice", id="duplicate-resource"
        ),
        pytest.param(
            [{"name": "example.com/a", "static": {"count": -1}}], r"resources\[0\]\.static\.count", id="neg"
        ),
        pytest.param(
            [{"name": "example.com/a", "static": {"devices": [{"id": "a b"}]}}],
            r"resources\[0\]\.static\.devices",
            id="ws",
        ),
        pytest.param(
            [{"name": "example.com/a", "socket_name": "kubelet.sock", **static()}], "socket_name", id="s"
        ),
        pytest.param([{"name": "example.com/a", "colour": "red", **static()}], "colour", id="unknown-field"),
    ],
)
def test_bad_resource_settings_are_refused_naming_the_field(resources: list[object], fragment: str) -> None:
    """A typo or contradiction is an error with its location, never silently ignored."""
    with pytest.raises(ConfigError, match=fragment):
        Settings.load(resources=resources)


def test_a_socket_path_too_long_for_a_unix_socket_is_refused() -> None:
    """sun_path holds 107 bytes; a longer path would fail at bind time with a vaguer error."""
    with pytest.raises(ConfigError, match="longer than the 107 bytes"):
        Settings.load(
            device_plugins_dir="/tmp/" + "d" * 100, resources=[{"name": "example.com/a", **static()}]
        )


def test_a_yaml_config_file_is_read_and_flags_add_resources(tmp_path: Path) -> None:
    """The file gives the resources; extra resources from flags are added, scalar flags override."""
    config = tmp_path / "devshim.yaml"
    config.write_text(
        "device_plugins_dir: /tmp/a\nresources:\n  - name: example.com/a\n    static: {count: 1}\n"
    )
    settings = Settings.load(
        config, extra_resources=[{"name": "example.com/b", **static()}], device_plugins_dir=Path("/tmp/b")
    )
    assert [r.name for r in settings.resources] == ["example.com/a", "example.com/b"]
    assert settings.device_plugins_dir == Path("/tmp/b")


def test_environment_variables_set_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    """DEVSHIM_<FIELD> sets a field, for DaemonSet manifests that prefer env to files."""
    monkeypatch.setenv("DEVSHIM_POLL_INTERVAL_S", "0.5")
    assert Settings.load().poll_interval_s == 0.5


def test_the_environment_reads_lists_and_objects_as_json_and_refines_them_field_by_field() -> None:
    """What DEVSHIM_* gives, as read without pydantic-settings (which devshim no longer loads):
    names in any case, JSON for a list or an object, ``__`` into an object's fields on top of it,
    and another tool's DEVSHIM_ variables left alone."""
    environ = {
        "DEVSHIM_API_VERSIONS": '["v1beta1", "v1beta2"]',
        "DEVSHIM_HTTP": '{"host": "127.0.0.9", "port": 1}',
        "devshim_http__port": "2",
        "DEVSHIM_SOCKET__MODE": "0660",
        "DEVSHIM_JUDGE_CACHE": "/tmp/x",
        "OTHER": "1",
    }
    assert environment(environ) == {
        "api_versions": ["v1beta1", "v1beta2"],
        "http": {"host": "127.0.0.9", "port": "2"},
        "socket": {"mode": "0660"},
    }


@pytest.mark.parametrize(
    ("environ", "fragment"),
    [
        pytest.param(
            {"DEVSHIM_RESOURCES": "example.com/a"}, "DEVSHIM_RESOURCES: this setting holds", id="not-json"
        ),
        pytest.param(
            {"DEVSHIM_LOG_LEVEL": "INFO", "DEVSHIM_LOG_LEVEL__X": "1"},
            "log_level is not an object",
            id="into-a-scalar",
        ),
        # The kernel bounds one variable at 128 KiB: room for nesting that would exhaust the stack.
        pytest.param(
            {"DEVSHIM_RESOURCES": "[" * 100_000 + "]" * 100_000}, "nested too deeply", id="deep-json"
        ),
    ],
)
def test_a_bad_environment_variable_is_a_config_error_naming_it(
    environ: dict[str, str], fragment: str
) -> None:
    with pytest.raises(ConfigError, match=fragment):
        environment(environ)


def test_an_unknown_nested_environment_field_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEVSHIM_HTTP__PORTT", "1")
    with pytest.raises(ConfigError, match="http.portt"):
        Settings.load()


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param("resources: [", "not valid YAML", id="bad-yaml"),
        pytest.param("- a\n- b\n", "must hold a mapping", id="list-top"),
        pytest.param("prestart_timeout_s: 31\n", "prestart_timeout_s", id="over-kubelet-deadline"),
    ],
)
def test_a_bad_config_file_is_refused_with_its_path(tmp_path: Path, text: str, fragment: str) -> None:
    """Errors in a file name the file and the problem."""
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    with pytest.raises(ConfigError, match=fragment) as info:
        Settings.load(config)
    assert str(config) in str(info.value)


def test_a_missing_config_file_is_a_clear_error(tmp_path: Path) -> None:
    """A wrong --config path says so rather than starting with no resources."""
    with pytest.raises(ConfigError, match="cannot read config file"):
        Settings.load(tmp_path / "absent.yaml")


@pytest.mark.parametrize(
    "name",
    [
        "nodomain",
        "example.com/",
        "kubernetes.io/gpu",
        "foo.kubernetes.io/gpu",
        "x.io/kubernetes.io/gpu",
        "requests.example.com/gpu",
        "Example.com/gpu",
        "example.com/-gpu",
        "a" * 245 + ".com/gpu",
        "example.com/" + "g" * 64,
    ],
)
def test_resource_names_follow_the_kubelets_rules(name: str) -> None:
    """IsExtendedResourceName: a domain, outside kubernetes.io/, not starting with "requests.", and
    "requests." + name a qualified name; refused at load time, naming the field."""
    with pytest.raises(ConfigError, match=r"resources\[0\]\.name"):
        Settings.load(resources=[{"name": name, **static()}])


def test_a_valid_long_resource_name_is_accepted() -> None:
    name = "a" * 240 + ".com/" + "g" * 63
    resource = {"name": name, "socket_name": "long.sock", **static()}
    assert Settings.load(resources=[resource]).resources[0].name == name


def test_every_problem_is_one_line_with_its_yaml_location(tmp_path: Path) -> None:
    config = tmp_path / "devshim.yaml"
    config.write_text(
        "resources:\n  - name: example.com/a\n    static: {count: 1}\n"
        "  - name: bad\n    static: {count: -2}\n"
        "drivers:\n  - name: d\n"
    )
    with pytest.raises(ConfigError) as caught:
        Settings.load(config)
    lines = str(caught.value).splitlines()
    assert lines[0] == f"invalid settings in {config}:"
    assert any(line.startswith("  resources[1].name: ") for line in lines)
    assert any(line.startswith("  resources[1].static.count: ") for line in lines)
    assert "  drivers[0].command: Field required" in lines


def test_the_environment_overrides_the_file_and_flags_override_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """File < DEVSHIM_* < flags, nested fields merged key by key (a ConfigMap plus a pod's env)."""
    config = tmp_path / "devshim.yaml"
    config.write_text("poll_interval_s: 2\nhttp: {host: 127.0.0.5, port: 9000}\nlog_level: DEBUG\n")
    monkeypatch.setenv("DEVSHIM_POLL_INTERVAL_S", "0.5")
    monkeypatch.setenv("DEVSHIM_HTTP__PORT", "1234")
    monkeypatch.setenv("DEVSHIM_LOG_LEVEL", "WARNING")
    settings = Settings.load(config, log_level="ERROR")
    assert settings.poll_interval_s == 0.5
    assert (settings.http.host, settings.http.port) == ("127.0.0.5", 1234)
    assert settings.log_level == "ERROR"


def test_the_example_in_docs_configuration_md_is_valid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The documented example is a settings file devshim accepts, with every key it shows."""
    monkeypatch.delenv("DEVSHIM_HTTP__PORT", raising=False)
    text = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    example = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    config = tmp_path / "devshim.yaml"
    config.write_text(example)
    settings = Settings.load(config)
    assert settings.http.port == 9477 and settings.log_format == "text"
    assert [d.name for d in settings.drivers] == ["sim"]
    assert [r.name for r in settings.resources] == ["example.com/foo", "example.com/bar"]


# --- trailing newlines: a Python "$" matches before a final newline; no validator may -------


@pytest.mark.parametrize(
    "name", ["example.com/gpu\n", "example.com\n/gpu", "example.com/gpu\r\n", "example.com/gpu\n\n"]
)
def test_a_resource_name_with_a_newline_is_refused(name: str) -> None:
    """The kubelet's Go regexps refuse it, so Register would fail forever."""
    with pytest.raises(ValueError, match="must be 1-63 characters|DNS subdomain"):
        check_extended_resource_name(name)
    with pytest.raises(ConfigError, match=r"resources\[0\]\.name"):
        Settings.load(resources=[{"name": name, **static()}])


def _policy(**fields: object) -> dict[str, object]:
    return {"name": "example.com/a", **static(), "policy": fields}


@pytest.mark.parametrize(
    ("settings", "where"),
    [
        pytest.param(
            {"drivers": [{"name": "sim\n", "command": ["x"], "resources": ["example.com/a"]}]},
            r"drivers\[0\]\.name",
            id="driver-name",
        ),
        pytest.param(
            {"drivers": [{"name": "sim", "command": ["x"], "resources": ["example.com/a\n"]}]},
            r"drivers\[0\]\.resources\[0\]",
            id="driver-resources",
        ),
        pytest.param(
            {
                "drivers": [
                    {
                        "name": "sim",
                        "command": ["x"],
                        "resources": ["example.com/a"],
                        "resource_policies": {"example.com/a\n": {}},
                    }
                ]
            },
            r"drivers\[0\]\.resource_policies",
            id="resource-policies-key",
        ),
        pytest.param(
            {"resources": [{"name": "example.com/a", "static": {"devices": [{"id": "d0\n"}]}}]},
            r"resources\[0\]\.static\.devices\[0\]\.id",
            id="static-device-id",
        ),
        pytest.param(
            {
                "resources": [
                    {
                        "name": "example.com/a",
                        "static": {
                            "count": 1,
                            "grant": {
                                "device_nodes": [
                                    {"container_path": "/dev/a", "host_path": "/dev/a", "permissions": "rw\n"}
                                ]
                            },
                        },
                    }
                ]
            },
            r"device_nodes\[0\]\.permissions",
            id="device-node-permissions",
        ),
        pytest.param(
            {"resources": [_policy(cdi_kinds=["example.com/gpu\n"])]},
            r"policy\.cdi_kinds\[0\]",
            id="cdi-kind",
        ),
        pytest.param(
            {"resources": [_policy(envs=["SIM_DEVICES\n"])]},
            r"policy\.envs\[0\]",
            id="policy-env",
        ),
    ],
)
def test_names_and_ids_in_settings_with_a_trailing_newline_are_refused(
    settings: dict[str, Any], where: str
) -> None:
    """pydantic's ``pattern`` runs Rust regex, whose "$" is the end of the text; this keeps it so."""
    with pytest.raises(ConfigError, match=where):
        Settings.load(**settings)


def test_adapter_configs_refuse_names_and_ids_with_a_trailing_newline() -> None:
    """The simulator's and devfs's resource names, device IDs, ID prefixes and permissions."""
    from pydantic import ValidationError

    from adapters.devfs.config import GroupConfig
    from adapters.sim.config import ResourceConfig

    for sim in (
        {"name": "example.com/a\n", "count": 1},
        {"name": "example.com/a", "count": 1, "id_prefix": "a\n"},
        {"name": "example.com/a", "devices": [{"id": "a\n"}]},
    ):
        with pytest.raises(ValidationError):
            ResourceConfig.model_validate(sim)
    for devfs in (
        {"resource": "example.com/a\n", "paths": ["/dev/a"]},
        {"resource": "example.com/a", "paths": ["/dev/a"], "permissions": "rw\n"},
    ):
        with pytest.raises(ValidationError):
            GroupConfig.model_validate(devfs)


# --- drivers[].resources: which resources a driver may serve -----------------------------------


def _driver(name: str, resources: list[str] | None) -> dict[str, object]:
    return {"name": name, "command": ["x"], "resources": resources}


def test_a_driver_may_be_given_the_resources_it_serves() -> None:
    settings = Settings.load(drivers=[_driver("a", ["example.com/a", "example.com/b"]), _driver("b", [])])
    assert settings.drivers[0].resources == ["example.com/a", "example.com/b"]
    assert settings.drivers[1].resources == []  # it serves nothing: declared, if of little use


def test_a_driver_without_resources_is_refused_naming_the_setting_and_the_flag() -> None:
    """A driver never chooses its own resources: leaving them out is a config error, not a
    driver that serves whatever it reports."""
    with pytest.raises(ConfigError) as caught:
        Settings.load(drivers=[_driver("a", ["example.com/a"]), {"name": "b", "command": ["x"]}])
    message = str(caught.value)
    assert "drivers[1]: " in message
    assert "drivers[b].resources is not set" in message
    assert "--driver-resource b=RESOURCE" in message


def test_only_compats_discovery_loads_a_driver_without_resources() -> None:
    """`devshim compat` learns what a driver would serve, in its own sandbox (DISCOVER)."""
    settings = Settings.load(drivers=[{"name": "b", "command": ["x"]}], discover_resources=True)
    assert settings.drivers[0].resources is None


def test_resource_policies_apply_to_the_drivers_own_resources() -> None:
    driver = {
        **_driver("a", ["example.com/a", "example.com/b"]),
        "policy": {"envs": ["A_DEVICES"]},
        "resource_policies": {"example.com/b": {"envs": ["B_DEVICES"]}},
    }
    loaded = Settings.load(drivers=[driver]).drivers[0]
    assert loaded.grant_policy("example.com/a").where == "drivers[a].policy"
    assert loaded.grant_policy("example.com/a").settings.envs == ["A_DEVICES"]
    assert loaded.grant_policy("example.com/b").where == "drivers[a].resource_policies[example.com/b]"
    assert loaded.grant_policy("example.com/b").settings.envs == ["B_DEVICES"]


@pytest.mark.parametrize(
    ("resources", "policies"),
    [
        pytest.param(["example.com/a"], {"example.com/c": {}}, id="another-resource"),
        pytest.param([], {"example.com/a": {}}, id="no-resources"),
        pytest.param(None, {"example.com/a": {}}, id="resources-unset"),
    ],
)
def test_a_resource_policy_for_a_resource_the_driver_does_not_serve_is_refused(
    resources: list[str] | None, policies: dict[str, object]
) -> None:
    """A policy nobody reads would be a declaration that silently does nothing; even where
    compat's discovery lets the resources go unset."""
    with pytest.raises(ConfigError, match=r"drivers\[0\]: .*resource_policies names example.com/"):
        Settings.load(
            drivers=[{**_driver("a", resources), "resource_policies": policies}], discover_resources=True
        )


@pytest.mark.parametrize(
    ("settings", "fragment"),
    [
        pytest.param(
            {"drivers": [_driver("a", ["kubernetes.io/a"])]},
            r"drivers\[0\]\.resources\[0\]",
            id="invalid-name",
        ),
        pytest.param(
            {"drivers": [_driver("a", ["example.com/x"]), _driver("b", ["example.com/x"])]},
            "driver 'b' lists example.com/x in its resources, but driver 'a' has it",
            id="two-drivers",
        ),
        pytest.param(
            {
                "resources": [{"name": "example.com/x", **static()}],
                "drivers": [_driver("a", ["example.com/x"])],
            },
            r"driver 'a' lists example.com/x in its resources, but resources \(static\) has it",
            id="static-and-driver",
        ),
    ],
)
def test_a_resource_has_one_source_in_the_settings(settings: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        Settings.load(**settings)


DRA_POOL = {"name": "gpu.example.com", "resources": ["example.com/gpu"]}


def test_dra_takes_the_node_name_from_the_downward_api(monkeypatch: pytest.MonkeyPatch) -> None:
    """NODE_NAME (fieldRef spec.nodeName) unless dra.node_name says otherwise."""
    monkeypatch.setenv("NODE_NAME", "node-7")
    assert Settings.load(dra={"drivers": [DRA_POOL]}).dra.node_name == "node-7"
    assert Settings.load(dra={"drivers": [DRA_POOL], "node_name": "node-8"}).dra.node_name == "node-8"
    monkeypatch.delenv("NODE_NAME")
    assert Settings.load().dra.node_name is None  # no DRA, no node name needed


@pytest.mark.parametrize(
    ("dra", "fragment"),
    [
        ({"drivers": [DRA_POOL]}, "NODE_NAME is not in the environment"),
        ({"drivers": [DRA_POOL], "node_name": "Node_1"}, "'Node_1' is not a node name"),
        ({"drivers": [{**DRA_POOL, "name": "GPU.example.com"}], "node_name": "n"}, "not a DRA driver name"),
        ({"drivers": [{**DRA_POOL, "name": "g" * 64}], "node_name": "n"}, "at most 63 characters"),
        ({"drivers": [{**DRA_POOL, "resources": []}], "node_name": "n"}, "dra.drivers[0].resources"),
        (
            {"drivers": [{**DRA_POOL, "resources": ["gpu"]}], "node_name": "n"},
            "not an extended resource name",
        ),
        ({"drivers": [DRA_POOL, DRA_POOL], "node_name": "n"}, "named twice"),
        (
            {"drivers": [DRA_POOL, {**DRA_POOL, "name": "other.example.com"}], "node_name": "n"},
            "a resource is in two DRA drivers' pools",
        ),
        ({"drivers": [DRA_POOL], "node_name": "n", "kubconfig": "/x"}, "kubconfig"),
        # It names the CDI vendor of the claims' devices, which starts with a letter.
        ({"drivers": [{**DRA_POOL, "name": "9gpu.example.com"}], "node_name": "n"}, "starts with a letter"),
        (
            {"drivers": [DRA_POOL], "node_name": "n", "plugins_dir": "/" + "p" * 80},
            "dra.sock (or the private directory devshim binds it in first) is longer than the 107 bytes",
        ),
    ],
)
def test_bad_dra_settings_are_refused_naming_the_problem(
    dra: dict[str, Any], fragment: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        Settings.load(dra=dra)


def test_dra_pools_need_the_deallocate_emulation() -> None:
    """A device the device plugin gave a container is withdrawn from the DRA pool until the
    emulation sees it freed (core/holds.py): turning the emulation off with a pool is refused."""
    with pytest.raises(ConfigError, match=re.escape("deallocation.enabled must stay true")):
        Settings.load(dra={"drivers": [DRA_POOL], "node_name": "n"}, deallocation={"enabled": False})
    assert Settings.load(deallocation={"enabled": False}).dra.drivers == []


def test_a_pool_served_through_dra_only_needs_no_deallocate_emulation() -> None:
    """device_plugin: false, the last stage of a migration: nothing the device plugin holds."""
    settings = Settings.load(
        dra={"drivers": [{**DRA_POOL, "device_plugin": False}], "node_name": "n"},
        deallocation={"enabled": False},
    )
    assert settings.dra.drivers[0].device_plugin is False
