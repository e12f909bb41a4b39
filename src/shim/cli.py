"""The ``devshim`` command."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from loguru import logger

from shim import __version__, configcheck, logs
from shim.configfile import ConfigError, read_config_file
from shim.errors import ShimError
from shim.nodeconfig import NodeConfigs
from shim.runtime import run as run_shim
from shim.settings import Settings
from shim.status import StatusUnavailable, fetch_status, render_status

# Plain click help, not rich's: it rewraps each docstring paragraph to the terminal at word
# boundaries (rich keeps the docstring's own line breaks) and shows no type placeholders for flags.
app = typer.Typer(
    help="devshim: serve hardware drivers to the kubelet through every device-plugin API version.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def parse_driver(spec: str) -> dict[str, object]:
    """``sim=python -m devshim_adapters.sim --config sim.yaml`` -> a driver (argv split like a shell
    would, but never run through one)."""
    name, sep, command = spec.partition("=")
    argv = shlex.split(command)
    if not sep or not argv:
        raise typer.BadParameter(f"{spec!r}: expected NAME=COMMAND, e.g. sim='devshim-sim --config sim.yaml'")
    return {"name": name, "command": argv}


def driver_envs(specs: list[str], drivers: set[str]) -> dict[str, dict[str, str]]:
    """``sim=PATH=/usr/bin`` sets PATH in the environment of driver sim, ``sim=PATH`` passes on
    devshim's own PATH: by driver name, the whole environment each is given."""
    envs: dict[str, dict[str, str]] = {}
    for spec in specs:
        name, sep, assignment = spec.partition("=")
        key, has_value, value = assignment.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{spec!r}: expected NAME=KEY=VALUE or NAME=KEY, e.g. sim=PATH=/usr/bin")
        _known_driver(spec, name, drivers)
        if not has_value and key not in os.environ:
            raise typer.BadParameter(f"{spec!r}: {key} is not set in devshim's environment")
        envs.setdefault(name, {})[key] = value if has_value else os.environ[key]
    return envs


ALLOWLISTS = ("envs", "device_nodes", "mounts", "cdi_kinds")


def driver_declarations(
    resources: list[str], allows: list[str], drivers: set[str], users: Sequence[str] = ()
) -> dict[str, dict[str, Any]]:
    """``sim=example.com/gpu`` lets driver sim serve example.com/gpu; ``sim=envs:SIM_*`` lets its
    grants set SIM_* variables; ``sim=root`` runs it as root: by driver name, its ``resources``,
    ``policy`` and ``user``."""
    declared: dict[str, dict[str, Any]] = {}
    for spec in users:
        name, user = _driver_setting(spec, drivers, "NAME=USER, e.g. sim=nobody or legacy=root")
        declared.setdefault(name, {})["user"] = user
    for spec in resources:
        name, resource = _driver_setting(spec, drivers, "NAME=RESOURCE, e.g. sim=example.com/gpu")
        declared.setdefault(name, {}).setdefault("resources", []).append(resource)
    for spec in allows:
        name, sep, allowed = spec.partition("=")
        setting, colon, value = allowed.partition(":")
        if not sep or not colon or setting not in ALLOWLISTS or not value:
            raise typer.BadParameter(
                f"{spec!r}: expected NAME=SETTING:VALUE with SETTING one of {', '.join(ALLOWLISTS)}, "
                "e.g. sim=envs:SIM_DEVICES"
            )
        _known_driver(spec, name, drivers)
        policy = declared.setdefault(name, {}).setdefault("policy", {})
        policy.setdefault(setting, []).append(value)
    return declared


def _driver_setting(spec: str, drivers: set[str], expected: str) -> tuple[str, str]:
    """``NAME=VALUE`` for a --driver NAME, VALUE not empty, as (NAME, VALUE)."""
    name, sep, value = spec.partition("=")
    if not sep or not value:
        raise typer.BadParameter(f"{spec!r}: expected {expected}")
    _known_driver(spec, name, drivers)
    return name, value


def _known_driver(spec: str, name: str, drivers: set[str]) -> None:
    # After the spec's own form is checked: a malformed spec is told its form first.
    if name not in drivers:
        raise typer.BadParameter(f"{spec!r}: no --driver is named {name!r}")


def parse_resource(spec: str) -> dict[str, object]:
    """``vendor.example/dev=4`` -> a resource with 4 static devices named dev0..dev3."""
    name, sep, count = spec.rpartition("=")
    if not sep or not (count.isascii() and count.isdigit()):
        raise typer.BadParameter(f"{spec!r}: expected NAME=COUNT, e.g. example.com/foo=4")
    return {"name": name, "static": {"count": int(count)}}


def _config_option(help: str) -> Any:
    """-c/--config FILE, devshim's settings file: each command says what it reads it for."""
    return typer.Option("--config", "-c", metavar="FILE", help=help)


# The same flag, in the same words, wherever a command can show devshim's log.
_Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Show devshim's log as well.")]


def _settings_or_exit(load: Callable[[], Settings]) -> Settings:
    """The settings, or exit 2 with every problem on its own line (never a traceback)."""
    try:
        return load()
    except ConfigError as exc:
        typer.echo(f"devshim: {exc}", err=True)
        raise typer.Exit(2) from None


@app.command(short_help="Serve the configured resources to the kubelet.")
def run(
    config: Annotated[Path | None, _config_option("YAML settings file (see docs/configuration.md).")] = None,
    device_plugins_dir: Annotated[
        Path | None,
        typer.Option(
            metavar="DIR",
            help="Where kubelet.sock and plugin sockets live. Default: /var/lib/kubelet/device-plugins.",
        ),
    ] = None,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            metavar="DIR", help="devshim's own state (last known devices). Default: /var/lib/devshim."
        ),
    ] = None,
    resource: Annotated[
        list[str] | None,
        typer.Option(
            "--resource",
            "-r",
            metavar="NAME=COUNT",
            help="Serve COUNT static devices as resource NAME (repeatable; adds to --config's).",
        ),
    ] = None,
    driver: Annotated[
        list[str] | None,
        typer.Option(
            "--driver",
            "-d",
            metavar="NAME=COMMAND",
            help="Run a driver subprocess and serve its resources (repeatable; adds to --config's).",
        ),
    ] = None,
    driver_env: Annotated[
        list[str] | None,
        typer.Option(
            "--driver-env",
            "-e",
            metavar="NAME=KEY=VALUE",
            help="Set KEY in the environment of --driver NAME (repeatable); NAME=KEY passes on devshim's "
            "own value. A driver gets no other variables, not even PATH.",
        ),
    ] = None,
    driver_resource: Annotated[
        list[str] | None,
        typer.Option(
            "--driver-resource",
            metavar="NAME=RESOURCE",
            help="A resource --driver NAME may serve (repeatable; at least one per --driver): a driver "
            "never chooses its own.",
        ),
    ] = None,
    driver_allow: Annotated[
        list[str] | None,
        typer.Option(
            "--driver-allow",
            metavar="NAME=SETTING:VALUE",
            help="Let --driver NAME's grants hold VALUE (repeatable): SETTING is envs (a name, or a prefix "
            "ending in *), device_nodes or mounts (host path globs) or cdi_kinds (vendor/class). "
            'Nothing else is allowed (docs/configuration.md, "Grant policy").',
        ),
    ] = None,
    driver_user: Annotated[
        list[str] | None,
        typer.Option(
            "--driver-user",
            metavar="NAME=USER",
            help="Run --driver NAME as USER (a name or uid; root keeps devshim's). Default: nobody "
            "(65534) with the groups of the device nodes it may grant, when devshim runs as root.",
        ),
    ] = None,
    log_level: Annotated[
        str | None,
        typer.Option(metavar="LEVEL", help="TRACE, DEBUG, INFO, WARNING or ERROR. Default: INFO."),
    ] = None,
    log_format: Annotated[
        str | None, typer.Option(metavar="FORMAT", help="text (default) or json: one object per line.")
    ] = None,
) -> None:
    """Serve the configured resources to the kubelet and keep them registered.

    SIGTERM or SIGINT: stop, removing our sockets. SIGHUP: reload --config, restarting only the
    drivers whose settings changed. With node_configs in --config, the node's label chooses the
    config, and a change of it reloads as SIGHUP does."""
    drivers = [parse_driver(spec) for spec in driver or []]
    names = {str(d["name"]) for d in drivers}
    envs = driver_envs(driver_env or [], names)
    declared = driver_declarations(driver_resource or [], driver_allow or [], names, driver_user or [])
    read = functools.partial(
        Settings.load,
        extra_resources=[parse_resource(spec) for spec in resource or []],
        extra_drivers=[
            {**d, "env": envs.get(str(d["name"]), {}), **declared.get(str(d["name"]), {})} for d in drivers
        ],
        device_plugins_dir=device_plugins_dir,
        state_dir=state_dir,
        log_level=log_level,
        log_format=log_format,
    )
    settings = _settings_or_exit(lambda: read(config))
    if not settings.resources and not settings.drivers and settings.node_configs is None:
        typer.echo("devshim: nothing to serve: pass --resource, --driver or a --config file", err=True)
        raise typer.Exit(2)
    logs.setup(settings.log_level, settings.log_format)
    node_configs = None if settings.node_configs is None else NodeConfigs(settings.node_configs, config, read)
    load = functools.partial(read, config) if node_configs is None else node_configs.load
    try:
        asyncio.run(run_shim(settings, reload=load, node_configs=node_configs))
    except ShimError as exc:
        logger.error("{}", exc)
        raise typer.Exit(1) from None


@app.command("check-config", short_help="Check a settings file without serving anything.")
def check_config(
    config: Annotated[Path, typer.Argument(metavar="FILE", help="The YAML settings file to check.")],
    strict: Annotated[
        bool, typer.Option("--strict", help="Exit 2 on warnings too (a driver program not found here, ...).")
    ] = False,
) -> None:
    """Check a settings file without serving anything: exit 0 and a summary if it is valid (what
    each driver and static resource may grant, resource by resource, and a warning line for each
    likely mistake), else one line per problem with its location and exit 2."""
    placeholder = configcheck.pod_node_placeholder(config)  # NODE_NAME comes from the pod
    try:
        if placeholder is not None:
            os.environ["NODE_NAME"] = placeholder
        settings = Settings.load(config)
    except ConfigError as exc:
        why = _driver_config(config)
        if why is not None:
            typer.echo(
                f"devshim: {config} is not devshim's settings but, it seems, a driver's own configuration "
                f"({why}): name it in a driver's command, e.g. drivers: [{{name: sim, command: [devshim-sim, "
                f"--config, {config}]}}] (docs/configuration.md)",
                err=True,
            )
        else:
            typer.echo(f"devshim: {exc}", err=True)
        raise typer.Exit(2) from None
    served = [r.name for r in settings.resources] + [f"driver {d.name}" for d in settings.drivers]
    typer.echo(
        f"{config}: valid; serves {', '.join(served) or 'nothing'}; {settings.registration} registration; "
        f"API {', '.join(settings.api_versions)}"
    )
    for line in configcheck.grants(settings):
        typer.echo(line)
    for line in configcheck.dra(settings, node_from_pod=placeholder is not None):
        typer.echo(line)
    named, problems = configcheck.node_configs(settings, Settings.load)
    for line in named:
        typer.echo(line)
    if problems:
        for problem in problems:
            typer.echo(f"devshim: {problem}", err=True)
        raise typer.Exit(2)
    found = configcheck.warnings(settings)
    for warning in found:
        typer.echo(f"{config}: warning: {warning}", err=True)
    if found and strict:
        raise typer.Exit(2)


def _driver_config(path: Path) -> str | None:
    try:
        return configcheck.foreign(read_config_file(path))
    except ConfigError:
        return None


@app.command(short_help="Show what a running devshim is doing.")
def status(
    config: Annotated[
        Path | None, _config_option("The running devshim's settings file (for its address).")
    ] = None,
    address: Annotated[
        str | None,
        typer.Option(
            metavar="HOST:PORT", help="The running devshim's ops endpoint. Default: from settings (http)."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw JSON.")] = False,
) -> None:
    """Show what a running devshim is doing: resources, registration, devices by health, drivers,
    the deallocation emulation."""
    settings = _settings_or_exit(functools.partial(Settings.load, config))
    host, port = settings.http.host, settings.http.port
    if address:
        host, _, port_text = address.rpartition(":")
        if not (port_text.isascii() and port_text.isdigit()):
            typer.echo(f"devshim status: --address {address!r}: expected HOST:PORT", err=True)
            raise typer.Exit(2)
        port = int(port_text)
    try:
        report = fetch_status("127.0.0.1" if host in ("", "0.0.0.0", "::") else host, port)
    except StatusUnavailable as exc:
        typer.echo(f"devshim status: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(json.dumps(report, indent=2) if as_json else render_status(report))


@app.command(short_help="Watch the whole path against a built-in fake kubelet.")
def demo(
    verbose: _Verbose = False,
) -> None:
    """Show register, list, health flip, allocate and pre-start against a built-in fake kubelet
    and the simulated driver, explaining each term as it first appears; needs no kubelet and
    changes nothing outside a temp directory."""
    from shim.compat.demo import demo as run_demo

    logger.remove()
    logger.add(sys.stderr, level="DEBUG" if verbose else "ERROR")
    asyncio.run(run_demo())


compat_app = typer.Typer()  # `devshim compat`, and `devshim compat merge`
app.add_typer(compat_app, name="compat")


@compat_app.callback(
    invoke_without_command=True,
    short_help="Run the compatibility matrix against a driver or a device plugin.",
)
def compat(
    context: typer.Context,
    driver: Annotated[
        str | None,
        typer.Option(metavar="COMMAND", help="A devshim driver to test behind devshim (argv, no shell)."),
    ] = None,
    plugin: Annotated[
        str | None,
        typer.Option(
            metavar="COMMAND",
            help="A device plugin to test without devshim; {dir} in COMMAND names its device-plugins "
            "directory (without it: a private mount namespace over /var/lib/kubelet/device-plugins, "
            "root only).",
        ),
    ] = None,
    socket: Annotated[
        Path | None,
        typer.Option(
            metavar="SOCKET", help="The socket of a device plugin already running (no registration checks)."
        ),
    ] = None,
    health_hook: Annotated[
        str | None,
        typer.Option(
            metavar="SHELL",
            help="Makes the driver report $DEVSHIM_COMPAT_DEVICE of $DEVSHIM_COMPAT_RESOURCE Unhealthy "
            "(its pid: $DEVSHIM_COMPAT_DRIVER_PID), or the --plugin change that device (its pid: "
            "$DEVSHIM_COMPAT_PLUGIN_PID); without it the health_change and change_after_dropped_stream "
            "rows are skipped.",
        ),
    ] = None,
    profile: Annotated[
        list[str] | None,
        typer.Option(
            metavar="PROFILE", help="Kubelet profile(s): 1.24, 1.25-1.32, 1.33+, next. Default: all."
        ),
    ] = None,
    judge: Annotated[
        list[str] | None,
        typer.Option(
            metavar="RELEASE",
            help="Judge with the kubelet's real device manager instead of the model's profiles: "
            "upstream-1.NN (repeatable) or upstream for every release devshim carries (root, Go; "
            "built on first use, docs/compat.md).",
        ),
    ] = None,
    prebuild: Annotated[
        bool,
        typer.Option("--prebuild", help="With --judge: build the judge's harnesses into the cache and exit."),
    ] = False,
    kubelet: Annotated[
        list[str] | None,
        typer.Option(
            metavar="VERSIONS", help="API versions the kubelet speaks: v1beta1, both, v1beta2. Default: all."
        ),
    ] = None,
    registration: Annotated[
        list[str] | None, typer.Option(metavar="MODE", help="classic, watcher. Default: both.")
    ] = None,
    scenario: Annotated[
        list[str] | None, typer.Option(metavar="ROW", help="Only these rows (repeatable).")
    ] = None,
    quick: Annotated[
        bool,
        typer.Option(
            "--quick", help="Every v1beta1 cell plus pairwise coverage of the rest (what devshim's CI runs)."
        ),
    ] = False,
    junit: Annotated[Path | None, typer.Option(metavar="FILE", help="Write JUnit XML here.")] = None,
    json_file: Annotated[
        Path | None, typer.Option("--json", metavar="FILE", help="Write the results as JSON here.")
    ] = None,
    cell_timeout: Annotated[float, typer.Option(metavar="SECONDS", help="Seconds one cell may take.")] = 90.0,
    config: Annotated[
        Path | None,
        _config_option(
            "devshim's settings: the driver runs as `devshim run` would run its drivers[] entry "
            "(its env, grant policy, timeouts); without --driver, its command too."
        ),
    ] = None,
    driver_name: Annotated[
        str | None, typer.Option(metavar="NAME", help="Which driver of --config (when it has several).")
    ] = None,
    relaxed: Annotated[
        bool,
        typer.Option(
            "--relaxed",
            help="Allow any grant and give the driver this shell's environment: judge the protocol "
            "only (by default the driver gets what `devshim run` gives it: exactly its env, and its "
            "grants held to its grant policy).",
        ),
    ] = False,
    driver_user: Annotated[
        str | None,
        typer.Option(
            metavar="USER",
            help="Run the driver as USER (a name or uid; root keeps this shell's), over --config's "
            "drivers[].user. Default: as `devshim run` would, nobody when root.",
        ),
    ] = None,
    suggest_policy: Annotated[
        bool,
        typer.Option(
            "--suggest-policy",
            help="Print the declaration (drivers[]: resources and policy) the driver's grants needed. "
            "Printed anyway without --config, or when the declared policy refused a grant.",
        ),
    ] = False,
    expect: Annotated[
        list[str] | None,
        typer.Option(
            metavar="[RESOURCE:]KIND=VALUE",
            help="Every Allocate answer must contain this: env=NAME, node=HOST_PATH, "
            "mount=HOST_PATH, annotation=KEY or cdi=NAME (repeatable).",
        ),
    ] = None,
    cdi_dir: Annotated[
        list[Path] | None,
        typer.Option(
            metavar="DIR",
            help="A CDI spec folder on the node (e.g. /etc/cdi) holding specs the driver's CDI names "
            "resolve in, besides those it ships (repeatable); a name no spec resolves fails the "
            "allocate row.",
        ),
    ] = None,
    health_watch: Annotated[
        float,
        typer.Option(
            metavar="SECONDS",
            help="How long the health_watch row waits for a health change the driver makes on its "
            "own (default 0: the row is skipped).",
        ),
    ] = 0.0,
    dra: Annotated[
        bool,
        typer.Option(
            "--dra",
            help="Judge a driver as a DRA driver (--driver: every resource it declares; --config: its "
            "first dra.drivers pool), or --dra-plugin, under the kubelet's real DRA manager and a real "
            "API server (Go; built on first use, docs/compat.md).",
        ),
    ] = False,
    dra_pair: Annotated[
        list[str] | None,
        typer.Option(
            metavar="KUBELET/APISERVER",
            help="With --dra: a kubelet and API server release pair, e.g. 1.33/1.33 (repeatable), or "
            "all. Default: the oldest and the newest release, each with its own API server.",
        ),
    ] = None,
    dra_plugin: Annotated[
        str | None,
        typer.Option(
            metavar="COMMAND",
            help="With --dra: a DRA kubelet plugin to judge without devshim; {registry}, {plugins}, "
            "{cdi}, {node} and {kubeconfig} in COMMAND name the cell's (docs/compat.md).",
        ),
    ] = None,
    shard: Annotated[
        str | None,
        typer.Option(
            metavar="I/N",
            help="Run only shard I of N: a stable slice of the cells, balanced by --costs (each job of "
            "a CI matrix or an Indexed Job runs one; `devshim compat merge` joins their --json).",
        ),
    ] = None,
    costs: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="With --shard: an earlier run's --json, whose cells' seconds balance the shards "
            "(default: every cell costs the same).",
        ),
    ] = None,
    verbose: _Verbose = False,
) -> None:
    """Run the compatibility matrix against a driver (behind devshim) or a device plugin, with the
    built-in fake kubelet in a temp directory; exit 0 only if every cell that applies passed.
    `devshim compat merge REPORT...` joins the --json reports of a run's --shard jobs."""
    if context.invoked_subcommand is not None:
        return
    from shim.compat import command
    from shim.compat.shards import Shard, ShardError

    try:
        chosen_shard = Shard.parse(shard) if shard is not None else None
    except ShardError as exc:
        typer.echo(f"devshim compat: {exc}", err=True)
        raise typer.Exit(2) from None

    request = command.Request(
        driver=driver,
        plugin=plugin,
        socket=socket,
        health_hook=health_hook,
        selection=command.Selection(
            profile or (),
            kubelet or (),
            registration or (),
            scenario or (),
            quick,
            judge or (),
            dra_pair or (),
        ),
        junit=junit,
        json=json_file,
        cell_timeout_s=cell_timeout,
        prebuild=prebuild,
        config=config,
        driver_name=driver_name,
        relaxed=relaxed,
        driver_user=driver_user,
        suggest_policy=suggest_policy,
        expect=expect or (),
        health_watch_s=health_watch,
        cdi_dirs=cdi_dir or (),
        dra=dra,
        dra_plugin=dra_plugin,
        shard=chosen_shard,
        costs=costs,
    )
    command.quiet_logs(verbose)
    try:
        code = command.run(request)
    except command.UsageError as exc:
        typer.echo(f"devshim compat: {exc}", err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(code)


@compat_app.command("merge", short_help="Join the --json reports of a run's shards into one report.")
def compat_merge(
    reports: Annotated[list[Path], typer.Argument(metavar="REPORT...", help="Every shard's --json.")],
    junit: Annotated[Path | None, typer.Option(metavar="FILE", help="Write JUnit XML here.")] = None,
    json_file: Annotated[
        Path | None, typer.Option("--json", metavar="FILE", help="Write the merged results as JSON here.")
    ] = None,
) -> None:
    """Join the --json reports of `devshim compat --shard I/N` runs into the table, JSON and JUnit
    one run would give: exit 0 only if no cell failed, 2 unless the reports are every shard of one
    run, each once."""
    from shim.compat import command

    try:
        code = command.merge(reports, junit, json_file)
    except command.UsageError as exc:
        typer.echo(f"devshim compat merge: {exc}", err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(code)


@app.command(short_help="Print devshim's version and the API versions it serves.")
def version() -> None:
    """Print devshim's version and the kubelet API versions it serves."""
    typer.echo(f"devshim {__version__} (kubelet device-plugin API: v1beta1; v1beta2 experimental, opt-in)")


def main() -> None:
    app()
