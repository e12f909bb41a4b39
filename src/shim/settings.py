"""devshim's one typed settings object.

Sources, lowest to highest priority: defaults, a YAML/JSON config file,
``DEVSHIM_*`` environment variables (nested with ``__``), command-line flags.
Later issues extend these classes rather than inventing flags per feature.
The parts that others use without the rest sit below this module: the grant template
(shim/grants.py), the grant policy's settings (shim/policy.py), the extended-resource-name
check (shim/names.py) and config-file reading (shim/configfile.py).
"""

from __future__ import annotations

import collections.abc
import grp
import json
import os
import pwd
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Self, Union, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from shim.configfile import ConfigError, StrictModel, format_validation_error, read_config_file
from shim.errors import GrantRefused
from shim.facts import (
    DEVICE_PLUGINS_DIR,
    KUBELET_PRESTART_DEADLINE_S,
    KUBELET_SOCKET,
    PLUGINS_DIR,
    PLUGINS_REGISTRY_DIR,
    POD_RESOURCES_SOCKET,
    PRESTART_TIMEOUT_S,
    is_label_name,
)
from shim.grants import GrantSettings, expand
from shim.model import MAX_NUMA_NODE
from shim.names import check_extended_resource_name, driver_name_problem, node_name_problem
from shim.policy import GrantPolicy, GrantPolicySettings
from shim.policy.paths import normal

# sun_path is 108 bytes on Linux, including the terminating NUL.
MAX_SOCKET_PATH = 107
# devshim binds each socket first as <dir>/.devshim-bind-<8 hex>/.s (node/sockets.py):
# that path must fit in sun_path too.
PRIVATE_BIND_EXTRA = len("/.devshim-bind-01234567/.s")

# Each devshim instance names its sockets with an id of this many hex digits, so two instances
# on a node (a rolling update) never clash (shim/node/handover.py).
INSTANCE_ID_DIGITS = 6


def socket_prefix(resource: str) -> str:
    return "devshim-" + resource.replace("/", "_")


def default_socket_name(resource: str, instance: str = "0" * INSTANCE_ID_DIGITS) -> str:
    return f"{socket_prefix(resource)}-{instance}.sock"


ResourceName = Annotated[str, AfterValidator(check_extended_resource_name)]


class StaticDeviceSettings(StrictModel):
    id: Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[^\s,]+$")]
    # strict: YAML's true is no NUMA node.
    numa_nodes: list[Annotated[int, Field(ge=0, le=MAX_NUMA_NODE, strict=True)]] = []
    healthy: bool = True


class StaticSourceSettings(StrictModel):
    """Either ``count`` devices named ``<id_prefix><n>``, or an explicit ``devices`` list."""

    count: Annotated[int, Field(ge=0, le=100_000)] | None = None
    id_prefix: Annotated[str, Field(min_length=1, max_length=40)] = "dev"
    devices: list[StaticDeviceSettings] | None = None
    grant: GrantSettings = GrantSettings()
    pre_start: bool = False
    preferred_allocation: bool = True

    @model_validator(mode="after")
    def _one_way_to_name_devices(self) -> Self:
        if (self.count is None) == (self.devices is None):
            raise ValueError("give exactly one of 'count' or 'devices'")
        if self.devices is not None:
            seen: set[str] = set()
            for device in self.devices:
                if device.id in seen:
                    raise ValueError(f"device ID {device.id!r} appears twice")
                seen.add(device.id)
        return self


def declared_by(template: GrantSettings) -> GrantPolicySettings:
    """The policy a static grant declares: exactly its names and paths, ``{id}`` as ``*`` (the
    operator wrote both the grant and this file). The floor still holds."""
    return GrantPolicySettings(
        envs=sorted(template.envs),
        device_nodes=sorted({_normal(n.host_path.replace("{id}", "*")) for n in template.device_nodes}),
        mounts=sorted({_normal(m.host_path) for m in template.mounts}),
        read_only_mounts=all(m.read_only for m in template.mounts),
        cdi_kinds=sorted({_cdi_kind(name) for name in template.cdi_devices}),
        annotation_key_prefixes=sorted(template.annotations),
    )


def _normal(path: str) -> str:
    # A relative path stays as written: the policy's settings then refuse it, naming it.
    return normal(path) if path.startswith("/") else path


def _cdi_kind(name: str) -> str:
    kind = name.partition("=")[0]
    return kind if "{id}" not in kind else kind.replace("{id}", "*")


class ResourceSettings(StrictModel):
    name: str
    socket_name: str | None = None
    static: StaticSourceSettings
    # null: what static.grant holds is declared, and nothing else.
    policy: GrantPolicySettings | None = None

    def grant_policy(self) -> GrantPolicy:
        declared = self.policy if self.policy is not None else declared_by(self.static.grant)
        where = f"resources[{self.name}].policy"
        return GrantPolicy(self.name, declared, where)

    @field_validator("name")
    @classmethod
    def _extended_name(cls, value: str) -> str:
        return check_extended_resource_name(value)

    @field_validator("socket_name")
    @classmethod
    def _plain_socket_name(cls, value: str | None) -> str | None:
        if value is not None and (not value or "/" in value or value in (".", "..", KUBELET_SOCKET)):
            raise ValueError(f"socket_name {value!r} must be a plain file name other than {KUBELET_SOCKET}")
        return value

    @model_validator(mode="after")
    def _grant_within_policy(self) -> Self:
        """A static grant outside its policy is a config error, not a refused first Allocate: what
        it says is fixed here. Where its host paths lead is still judged on every call."""
        static = self.static
        if static.devices is not None:
            ids = [d.id for d in static.devices]
        else:  # devices named by count differ only in their number, which cannot change a verdict
            ids = [f"{static.id_prefix}0"] if static.count else []
        try:
            policy = self.grant_policy()
        except ValidationError as invalid:  # a static grant naming something no policy can allow
            raise ValueError(f"static.grant cannot be declared: {invalid.errors()[0]['msg']}") from None
        for device_id in ids:
            try:
                policy.check_as_written(expand(static.grant, [device_id]))
            except GrantRefused as refused:
                raise ValueError(
                    f"static.grant for device {device_id!r}: {refused.field} {refused.shown} is outside "
                    f"the resource's policy: {refused.rule}"
                ) from None
        return self


class DriverTimeouts(StrictModel):
    """Per-method deadlines for driver calls (docs/driver-protocol.md, "Methods")."""

    initialize_s: Annotated[float, Field(gt=0, le=600)] = 30.0
    list_devices_s: Annotated[float, Field(gt=0, le=600)] = 30.0
    allocate_s: Annotated[float, Field(gt=0, le=600)] = 20.0
    preferred_allocation_s: Annotated[float, Field(gt=0, le=600)] = 5.0
    # Inside the kubelet's PreStartContainer deadline (shim/model.py).
    prestart_s: Annotated[float, Field(gt=0, lt=KUBELET_PRESTART_DEADLINE_S)] = PRESTART_TIMEOUT_S
    deallocate_s: Annotated[float, Field(gt=0, le=600)] = 10.0
    post_stop_s: Annotated[float, Field(gt=0, le=600)] = 10.0
    # Attaching hardware may take a while; the scheduler waits 10 minutes by default.
    attach_s: Annotated[float, Field(gt=0, le=600)] = 60.0
    detach_s: Annotated[float, Field(gt=0, le=600)] = 60.0
    shutdown_s: Annotated[float, Field(gt=0, le=600)] = 5.0


class DeallocationSettings(StrictModel):
    """Deallocate emulation for drivers on v1beta1, through the kubelet's PodResources List."""

    enabled: bool = True
    # Follows the kubelet's root dir, like plugins_registry (upstream default below).
    pod_resources_socket: Path = POD_RESOURCES_SOCKET
    # The kubelet allows 100 qps (burst 10) across all clients: poll gently.
    poll_interval_s: Annotated[float, Field(gt=0, le=3600)] = 10.0
    # How long a device group must be held by no listed container before it is released.
    grace_s: Annotated[float, Field(ge=0, le=3600)] = 30.0


class RestartPolicy(StrictModel):
    """How a failed driver is restarted (docs/driver-protocol.md, "Failures")."""

    # Consecutive failed starts after which the driver stays down (devices Unhealthy).
    max_start_failures: Annotated[int, Field(ge=1, le=1000)] = 5
    backoff_initial_s: Annotated[float, Field(gt=0, le=60)] = 0.1
    backoff_max_s: Annotated[float, Field(gt=0, le=600)] = 30.0
    # A driver that ran this long before failing is restarted without delay.
    stable_after_s: Annotated[float, Field(gt=0, le=3600)] = 30.0
    # How long allocate, prestart and deallocate wait for a restarting driver before failing.
    call_wait_s: Annotated[float, Field(ge=0, le=25)] = 10.0
    # More notifications than this within one second is a flood: the driver is restarted.
    max_notifications_per_s: Annotated[int, Field(ge=1)] = 1000


def user_id(value: str | int) -> int:
    """A user name or numeric id as a uid; a name must be in this node's user database."""
    return _id(value, "user", lambda name: pwd.getpwnam(name).pw_uid)


def group_id(value: str | int) -> int:
    """A group name or numeric id as a gid; a name must be in this node's group database."""
    return _id(value, "group", lambda name: grp.getgrnam(name).gr_gid)


def _id(value: str | int, what: str, by_name: Callable[[str], int]) -> int:
    # user_id and group_id differ only in the database a name is looked up in (KeyError: not there).
    if isinstance(value, int) or (value.isascii() and value.isdigit()):
        return _numeric_id(int(value), what)
    try:
        return by_name(value)
    except KeyError:
        raise ValueError(f"there is no {what} named {value!r} on this node") from None


def account(user: str | int) -> pwd.struct_passwd | None:
    """The user database's entry for a user name or uid; None for a uid it does not list."""
    try:
        return (
            pwd.getpwuid(int(user))
            if isinstance(user, int) or (user.isascii() and user.isdigit())
            else pwd.getpwnam(user)
        )
    except KeyError:
        return None


def _numeric_id(number: int, what: str) -> int:
    # (uid_t)-1 means "leave unchanged" to setuid and chown: it is never an id.
    if not 0 <= number < 2**32 - 1:
        raise ValueError(f"{number} is not a {what} id")
    return number


def _known_user(value: str | int) -> str | int:
    user_id(value)
    return value


def _known_group(value: str | int) -> str | int:
    group_id(value)
    return value


UserName = Annotated[str | int, AfterValidator(_known_user)]
GroupName = Annotated[str | int, AfterValidator(_known_group)]


class DriverStderrSettings(StrictModel):
    """How much of a driver's stderr reaches devshim's log; the rest is read and dropped."""

    # Longer lines are cut here and marked; the rest of the line is skipped.
    max_line_bytes: Annotated[int, Field(ge=80, le=1024 * 1024)] = 4096
    # Lines beyond this in one second are dropped, and counted in one warning when it ends.
    max_lines_per_s: Annotated[int, Field(ge=1, le=100_000)] = 100


# A validation context key: drivers without `resources` serve what they declare. Only for
# `devshim compat`, learning in its own sandbox what a driver would need declared.
DISCOVER = "discover_resources"


class DriverSettings(StrictModel):
    """A driver subprocess: started from ``command`` (an argv list, never a shell)
    with exactly ``env`` as its environment."""

    name: Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$", max_length=63)]
    command: Annotated[list[str], Field(min_length=1)]
    env: dict[str, str] = {}
    timeouts: DriverTimeouts = DriverTimeouts()
    restart: RestartPolicy = RestartPolicy()
    # Who the driver runs as (names or numeric ids). Unset: under a root devshim, nobody (65534),
    # with the groups of the device nodes its policy declares; root only where this says root
    # (driverhost/identity.py; docs/configuration.md, "Who a driver runs as").
    user: UserName | None = None
    group: GroupName | None = None
    stderr: DriverStderrSettings = DriverStderrSettings()
    # What the driver may grant for every resource it serves, unless resource_policies names it:
    # a policy there replaces this one whole (nothing is inherited, so nothing widens by surprise).
    # Empty by default: the driver grants nothing but device IDs.
    policy: GrantPolicySettings = GrantPolicySettings()
    resource_policies: dict[ResourceName, GrantPolicySettings] = {}
    # The only resources the driver may serve, reserved for it from the start: required, since a
    # driver never chooses its own (docs/driver-protocol.md, "Which resources a driver serves").
    resources: list[ResourceName] | None = None
    # The most devices the driver may hold over all its resources; a list that would take it
    # over is refused before it is read (docs/driver-protocol.md, "Limits").
    max_devices: Annotated[int, Field(ge=1)] = 50_000

    @field_validator("command")
    @classmethod
    def _program_given(cls, value: list[str]) -> list[str]:
        if not value[0]:
            raise ValueError("the program (first item) must not be empty")
        return value

    @model_validator(mode="after")
    def _resources_declared(self, info: ValidationInfo) -> Self:
        if self.resources is None and not (info.context or {}).get(DISCOVER):
            raise ValueError(
                f"drivers[{self.name}].resources is not set: list the resources this driver may serve "
                f"(on the command line: --driver-resource {self.name}=RESOURCE); a driver never chooses "
                'its own (docs/configuration.md, "Drivers")'
            )
        unlisted = sorted(set(self.resource_policies) - set(self.resources or ()))
        if unlisted:
            raise ValueError(f"resource_policies names {', '.join(unlisted)}, not in this driver's resources")
        return self

    @model_validator(mode="after")
    def _group_known(self) -> Self:
        if self.user is not None and self.group is None and account(self.user) is None:
            raise ValueError(f"user {self.user} is not in this node's user database: give its group too")
        return self

    def grant_policy(self, resource: str) -> GrantPolicy:
        """The policy of ``resource``, named by the setting it is read from."""
        if resource in self.resource_policies:
            where = f"drivers[{self.name}].resource_policies[{resource}]"
            return GrantPolicy(resource, self.resource_policies[resource], where)
        return GrantPolicy(resource, self.policy, f"drivers[{self.name}].policy")

    def spec_policy(self, kind: str) -> GrantPolicy:
        """The policy a CDI spec the driver ships is held to: its own (``policy``), the spec's
        devices judged as the grants they amount to."""
        return GrantPolicy(
            f"driver {self.name}'s CDI spec {kind}", self.policy, f"drivers[{self.name}].policy"
        )


def _octal_mode(value: object) -> object:
    """A mode written as a string is octal ("0660", "0o660"); unquoted YAML 0660 is octal already."""
    if isinstance(value, str):
        digits = value.strip().lower().removeprefix("0o")
        if not digits or any(c not in "01234567" for c in digits):
            raise ValueError(f'{value!r} is not an octal mode such as "0660"')
        return int(digits, 8)
    return value


def _socket_mode(value: int) -> int:
    if not 0 <= value <= 0o777:
        raise ValueError(f'{value} is not a permission mode: write it in octal, as a string ("0660")')
    if value & 0o600 != 0o600:
        raise ValueError(f"mode {value:04o} must let the owner read and write (0600)")
    if value & 0o007:
        raise ValueError(
            f"mode {value:04o} would let every local user use the plugin; grant a group access instead"
        )
    return value


class SocketSettings(StrictModel):
    """Who may connect to devshim's plugin sockets. The kubelet runs as root, which the default
    (owner only) serves; a reader running as another user (a sidecar) gets in through ``group``."""

    mode: Annotated[int, BeforeValidator(_octal_mode), AfterValidator(_socket_mode)] = 0o600
    group: GroupName | None = None


class HttpSettings(StrictModel):
    """The ops endpoint: /metrics (Prometheus), /healthz and /readyz (probes), /status."""

    enabled: bool = True
    # Every interface: the kubelet probes the pod's IP.
    host: str = "0.0.0.0"
    port: Annotated[int, Field(ge=0, le=65535)] = 9477
    # /status names socket paths, driver pids and errors: by default it answers only clients on
    # this host (`devshim status`); the probes and /metrics answer everyone.
    status_from_anywhere: bool = False


class DraDriverSettings(StrictModel):
    """One DRA driver: the resources whose devices make up its pool on this node."""

    # The DRA driver name (a lowercase DNS subdomain of at most 63 characters): spec.driver of
    # its ResourceSlices, and what DeviceClasses select.
    name: str
    resources: Annotated[list[ResourceName], Field(min_length=1)]
    # Serve these resources through the device plugin API too, each device held by one API at a
    # time (docs/dra.md, "Both APIs at once"); false: through DRA only, the last stage of a
    # migration (docs/dra.md, "From the device plugin to DRA").
    device_plugin: bool = True
    # Publish the binding conditions the driver's devices declare (driver protocol 1.4): devshim
    # then watches the ResourceClaims (every namespace's) and writes each allocated device's
    # conditions from the driver's attach answer (docs/dra.md, "Binding conditions"). Off: the
    # devices are published without them, and pods bind without waiting.
    binding_conditions: bool = False

    @field_validator("name")
    @classmethod
    def _dra_driver_name(cls, value: str) -> str:
        if (problem := driver_name_problem(value)) is not None:
            raise ValueError(problem)
        if not value[0].isalpha():  # it names the CDI vendor of the claims' devices (shim/cdi.py)
            raise ValueError(f"{value!r}: a DRA driver devshim serves starts with a letter")
        return value


class DraSettings(StrictModel):
    """Dynamic Resource Allocation (docs/dra.md): each driver's devices published as ResourceSlices."""

    drivers: list[DraDriverSettings] = []
    # This node's name: by default $NODE_NAME (the downward API's spec.nodeName).
    node_name: str | None = None
    # The API server's credentials: by default in-cluster (the pod's service account), else
    # $KUBECONFIG or ~/.kube/config.
    kubeconfig: Path | None = None
    # Each driver's DRA socket is <plugins_dir>/<driver>/dra.sock, where the kubelet dials it (it
    # follows the kubelet's --root-dir); it registers through Settings.plugins_registry_dir.
    plugins_dir: Path = PLUGINS_DIR
    # Where each prepared claim's CDI spec is written, for the container runtime to read (a
    # directory containerd and CRI-O read by default; generated specs belong in the /var/run one).
    cdi_dir: Path = Path("/var/run/cdi")

    @model_validator(mode="after")
    def _one_pool_per_driver_and_node(self) -> Self:
        names = [d.name for d in self.drivers]
        if len(set(names)) != len(names):
            raise ValueError("a DRA driver is named twice in dra.drivers")
        resources = [r for d in self.drivers for r in d.resources]
        if len(set(resources)) != len(resources):
            raise ValueError("a resource is in two DRA drivers' pools")
        if self.drivers:
            object.__setattr__(self, "node_name", this_node(self.node_name, "dra.node_name"))
        return self


def this_node(node_name: str | None, setting: str) -> str:
    """The node's name: ``node_name`` where set, else $NODE_NAME; checked as the API server
    checks a Node's name."""
    node = node_name or os.environ.get("NODE_NAME")
    if not node:
        raise ValueError(
            f"{setting} is not set and NODE_NAME is not in the environment: give the pod "
            "NODE_NAME from the downward API (fieldRef spec.nodeName)"
        )
    if (problem := node_name_problem(node)) is not None:
        raise ValueError(problem)
    return node


class NodeConfigSettings(StrictModel):
    """Named configs, one chosen per node by a label on its Node (docs/configuration.md,
    "Per-node configs"): the label's value V names <folder>/V.yaml; no label, or one naming no
    file, leaves this config (the default) in use. A change of the label is applied as SIGHUP
    applies a changed file, without a restart."""

    label: str
    folder: Path
    # This node's name: by default $NODE_NAME (the downward API's spec.nodeName).
    node_name: str | None = None
    # The API server's credentials: by default in-cluster, else $KUBECONFIG or ~/.kube/config.
    kubeconfig: Path | None = None
    # At start, the longest wait for the label before this config serves (until it is read).
    wait_s: Annotated[float, Field(ge=0, le=300)] = 30.0

    @field_validator("label")
    @classmethod
    def _label_key(cls, value: str) -> str:
        if not is_label_name(value):
            raise ValueError(f"{value!r} is not a label key (an optional DNS subdomain and '/', then a name)")
        return value

    @model_validator(mode="after")
    def _node(self) -> Self:
        object.__setattr__(self, "node_name", this_node(self.node_name, "node_configs.node_name"))
        return self


def static_device_count(resources: collections.abc.Iterable[ResourceSettings]) -> int:
    """How many devices the static resources hold (they count toward max_devices)."""
    return sum(
        r.static.count if r.static.count is not None else len(r.static.devices or ()) for r in resources
    )


class Settings(BaseModel):
    # Defaults are validated too: a default path goes through the same checks as a given one.
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    device_plugins_dir: Path = DEVICE_PLUGINS_DIR
    # devshim's own state (last known device lists, allocations in use). Never under
    # device_plugins_dir: kubelets up to ~1.32 delete every regular file there on start.
    state_dir: Path = Path("/var/lib/devshim")
    resources: list[ResourceSettings] = []
    drivers: list[DriverSettings] = []
    deallocation: DeallocationSettings = DeallocationSettings()
    # classic: Register on kubelet.sock (every kubelet). watcher: a registration socket in
    # plugins_registry, found by the kubelet's plugin watcher (docs/architecture.md says why
    # classic stays the default).
    registration: Literal["classic", "watcher"] = "classic"
    # Device-plugin API versions offered to the kubelet. v1beta2 is devshim's EXPERIMENTAL
    # one (docs/api-versions.md): off by default, so no real kubelet is ever offered a
    # version it might misread once upstream publishes a different v1beta2.
    api_versions: Annotated[list[Literal["v1beta1", "v1beta2"]], Field(min_length=1)] = ["v1beta1"]
    # Follows the kubelet's root dir (--root-dir), unlike device-plugins.
    plugins_registry_dir: Path = PLUGINS_REGISTRY_DIR
    # How kubelet restarts are noticed: inotify where the kernel offers it, else polling.
    watch_mode: Literal["auto", "inotify", "poll"] = "auto"
    poll_interval_s: Annotated[float, Field(gt=0, le=60)] = 1.0
    # Longest pause between Register attempts while the kubelet is away.
    register_backoff_max_s: Annotated[float, Field(gt=0, le=300)] = 5.0
    # Inside the kubelet's PreStartContainer deadline (shim/model.py).
    prestart_timeout_s: Annotated[float, Field(gt=0, lt=KUBELET_PRESTART_DEADLINE_S)] = PRESTART_TIMEOUT_S
    log_level: Literal["TRACE", "DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    # text for people; json: one object per line, for log collectors.
    log_format: Literal["text", "json"] = "text"
    http: HttpSettings = HttpSettings()
    # The plugin sockets' permissions (and group), set before the kubelet can see them.
    socket: SocketSettings = SocketSettings()
    dra: DraSettings = DraSettings()
    # The node's label chooses among named configs (NodeConfigSettings); unset: this file alone.
    node_configs: NodeConfigSettings | None = None
    # Where the CDI specs drivers ship are written (protocol 1.2), for the container runtime to
    # resolve the CDI names their grants give: one of its CDI spec dirs (containerd's and CRI-O's
    # defaults are /etc/cdi and /var/run/cdi), which the pod must mount. Unset: no driver may
    # ship one (its start fails, naming this setting), and nothing is written.
    cdi_dir: Path | None = None
    # The most devices devshim holds over every driver and static resource: two drivers at their
    # bound. At it devshim peaked at 181 MB re-sending lists, under the DaemonSet's 256 MiB
    # (268 MB) with room for its drivers; at 150,000 it reached the limit (docs/benchmarks.md,
    # row "bound").
    max_devices: Annotated[int, Field(ge=1)] = 100_000

    @model_validator(mode="after")
    def _static_devices_fit(self) -> Self:
        static = static_device_count(self.resources)
        if static > self.max_devices:
            raise ValueError(
                f"resources list {static:,} static devices: more than the {self.max_devices:,} "
                "max_devices allows in all"
            )
        return self

    @model_validator(mode="after")
    def _resources_fit(self) -> Self:
        names = [r.name for r in self.resources]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"resource(s) configured twice: {', '.join(dupes)}")
        plugins, state = self.device_plugins_dir.resolve(), self.state_dir.resolve()
        if state == plugins or state.is_relative_to(plugins):
            raise ValueError(
                f"state_dir {self.state_dir} must not be inside device_plugins_dir (the kubelet cleans it)"
            )
        if len(set(self.api_versions)) != len(self.api_versions):
            raise ValueError("api_versions lists a version twice")
        drivers = [d.name for d in self.drivers]
        dupes = sorted({n for n in drivers if drivers.count(n) > 1})
        if dupes:
            raise ValueError(f"driver name(s) used twice: {', '.join(dupes)}")
        # One source per resource name (bootstrap.Shim enforces the same on what drivers declare).
        owners = {r.name: "resources (static)" for r in self.resources}
        for driver in self.drivers:
            for name in driver.resources or ():
                owner = owners.setdefault(name, f"driver {driver.name!r}")
                if owner != f"driver {driver.name!r}":
                    raise ValueError(
                        f"driver {driver.name!r} lists {name} in its resources, but {owner} has it"
                    )
        sockets = [r.socket_name or default_socket_name(r.name) for r in self.resources]
        if len(set(sockets)) != len(sockets):
            raise ValueError("two resources share one socket_name")
        socket_dir = self.plugins_registry_dir if self.registration == "watcher" else self.device_plugins_dir
        for socket in sockets:
            path = socket_dir / socket
            if len(str(path).encode()) > MAX_SOCKET_PATH:
                raise ValueError(
                    f"socket path {path} is longer than the {MAX_SOCKET_PATH} bytes a unix socket allows"
                )
        for dra_driver in self.dra.drivers:
            # dra/plugin/server.py's paths, each bound in a private directory beside it first
            for path in (
                self.plugins_registry_dir / f"{dra_driver.name}-reg.sock",
                self.dra.plugins_dir / dra_driver.name / "dra.sock",
            ):
                if len(str(path.parent).encode()) + PRIVATE_BIND_EXTRA > MAX_SOCKET_PATH or (
                    len(str(path).encode()) > MAX_SOCKET_PATH
                ):
                    raise ValueError(
                        f"DRA driver {dra_driver.name}'s socket {path} (or the private directory devshim "
                        f"binds it in first) is longer than the {MAX_SOCKET_PATH} bytes a unix socket allows"
                    )
        if any(d.device_plugin for d in self.dra.drivers) and not self.deallocation.enabled:
            # core/holds.py: without it a device the device plugin gave a container never
            # returns to the DRA pool.
            raise ValueError(
                "dra.drivers serve their resources through both APIs, which needs the Deallocate "
                "emulation to know when the device plugin's containers free a device: "
                "deallocation.enabled must stay true (or set device_plugin: false on each DRA driver)"
            )
        served = self.resources or self.drivers
        if served and len(str(socket_dir).encode()) + PRIVATE_BIND_EXTRA > MAX_SOCKET_PATH:
            raise ValueError(
                f"{socket_dir} is too long: devshim binds its sockets in a subdirectory there first, "
                f"and that path would be longer than the {MAX_SOCKET_PATH} bytes a unix socket allows"
            )
        return self

    @property
    def kubelet_socket(self) -> Path:
        return self.device_plugins_dir / KUBELET_SOCKET

    @classmethod
    def load(
        cls,
        config_file: Path | None = None,
        extra_resources: list[dict[str, Any]] | None = None,
        extra_drivers: list[dict[str, Any]] | None = None,
        *,
        discover_resources: bool = False,
        **overrides: Any,
    ) -> Settings:
        """Build settings from a config file, the environment and overrides, or raise ConfigError.

        ``extra_resources``/``extra_drivers`` are added to the file's; other overrides
        that are not None replace the file's values.
        """
        data: dict[str, Any] = read_config_file(config_file) if config_file else {}
        if extra_resources:
            data["resources"] = [*data.get("resources", []), *extra_resources]
        if extra_drivers:
            data["drivers"] = [*data.get("drivers", []), *extra_drivers]
        given = {k: v for k, v in overrides.items() if v is not None}
        try:
            merged = _merged(_merged(data, environment(os.environ)), given)
            return cls.model_validate(merged, context={DISCOVER: discover_resources})
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc, config_file)) from None


ENV_PREFIX = "DEVSHIM_"
ENV_NESTED = "__"


def environment(environ: Mapping[str, str]) -> dict[str, Any]:
    """The settings ``DEVSHIM_<FIELD>`` variables give (docs/configuration.md): names in any case,
    ``__`` descending into an object's fields (``DEVSHIM_HTTP__PORT``), and a value for a field
    that holds a list, a mapping or an object read as JSON; the rest stay strings that validation
    converts. A variable naming no top-level field belongs to something else and is left alone."""
    found: dict[str, Any] = {}
    named = [
        (name, name[len(ENV_PREFIX) :].lower().split(ENV_NESTED), value)
        for name, value in environ.items()
        if name.upper().startswith(ENV_PREFIX)
    ]
    # Whole objects first, so that DEVSHIM_HTTP__PORT refines a DEVSHIM_HTTP given as JSON.
    for name, path, value in sorted(named, key=lambda item: len(item[1])):
        if path[0] not in Settings.model_fields:
            continue
        *parents, last = path
        target, model = found, _model_of(Settings)
        for key in parents:
            nested = target.setdefault(key, {})
            if not isinstance(nested, dict):
                raise ConfigError(f"{name}: {ENV_NESTED.join(parents)} is not an object here")
            target, model = nested, _model_of(_annotation(model, key))
        target[last] = _merged(target.get(last), _env_value(name, value, _annotation(model, last)))
    return found


def _annotation(model: type[BaseModel] | None, key: str) -> Any:
    field = model.model_fields.get(key) if model is not None else None
    return field.annotation if field is not None else None


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The model an annotation holds, directly or as ``Model | None``."""
    for candidate in (annotation, *get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


_CONTAINERS = (collections.abc.Mapping, collections.abc.Sequence, collections.abc.Set)


def _holds_json(annotation: Any) -> bool:
    if get_origin(annotation) in (Union, types.UnionType):
        return any(_holds_json(arm) for arm in get_args(annotation))
    kind = get_origin(annotation) or annotation
    if not isinstance(kind, type) or issubclass(kind, (str, bytes)):
        return False
    return issubclass(kind, (BaseModel, *_CONTAINERS))


def _env_value(name: str, value: str, annotation: Any) -> Any:
    if annotation is None or not _holds_json(annotation):
        return value  # a scalar, or a key no model names (validation then says so)
    try:
        return json.loads(value)
    except RecursionError:
        raise ConfigError(f"{name}: its JSON is nested too deeply to read") from None
    except ValueError as exc:
        if str in get_args(annotation):  # `str | list[...]`: a plain string is one of its forms
            return value
        raise ConfigError(f"{name}: this setting holds a list or an object, given as JSON: {exc}") from None


def _merged(base: Any, over: Any) -> Any:
    """``over`` on top of ``base``: objects merged key by key, anything else replaced."""
    if isinstance(base, dict) and isinstance(over, dict):
        return {**base, **{k: _merged(base.get(k), v) for k, v in over.items()}}
    return over
