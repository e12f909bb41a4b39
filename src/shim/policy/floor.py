"""The floor: what no declaration allows a grant, unless the operator lifts that one rule with
``unsafe: {RULE: true}`` (docs/configuration.md, "Grant policy").

An allowlist says what a driver may grant; the floor catches what an allowlist written too
broadly ("NVIDIA_*" is fine, "*" is not) would let through. Each rule is named, so a refusal can
say which one and how it is lifted. Device nodes are caught by name (as written and where links
lead), by number, and by the kernel driver that holds their major (/proc/devices), since
watchdog0, bsg and tpmrm get their major at boot. A mount is caught as well where it holds what
a rule guards: /run holds /run/containerd, /etc holds /etc/shadow.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from .paths import Looks, glob_regex, literal_head

FloorRule = Literal[
    "env.loader",
    "env.shell",
    "env.interpreter",
    "device.memory",
    "device.kmsg",
    "device.terminal",
    "device.input",
    "device.flash",
    "device.tpm",
    "device.watchdog",
    "device.scsi",
    "device.disk_control",
    "device.cpu",
    "device.snapshot",
    "mount.root",
    "mount.kernel",
    "mount.secrets",
    "mount.runtime",
    "container_path.system",
]


@dataclass(frozen=True)
class Rule:
    name: FloorRule
    why: str  # what it guards, as a refusal says it
    patterns: tuple[str, ...]  # env names (exact, or '*' for any run of characters) or path globs
    numbers: tuple[str, ...] = ()  # device numbers as the cgroup writes them ("c 1:1", "c 4:*")
    drivers: tuple[str, ...] = ()  # kernel driver names in /proc/devices


ENV_RULES = (
    Rule("env.loader", "the dynamic loader's and glibc's hooks (code loaded into every program)", (
        "LD_*", "GCONV_PATH", "GLIBC_TUNABLES", "LOCPATH", "NLSPATH", "HOSTALIASES", "MALLOC_*",
    )),
    Rule("env.shell", "what shells run or trace on start (SHELLOPTS=xtrace with PS4='$(cmd)' runs cmd)", (
        "SHELLOPTS", "BASHOPTS", "BASH_ENV", "ENV", "BASH_FUNC_*", "PS1", "PS2", "PS3", "PS4",
        "PROMPT_COMMAND", "IFS", "CDPATH", "GLOBIGNORE", "ZDOTDIR", "PATH",
    )),
    Rule("env.interpreter", "interpreters' start-up code, module paths and option variables", (
        "PYTHON*", "PERL*", "RUBY*", "NODE_*", "LUA_*", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_*",
        "CLASSPATH", "DOTNET_*", "CORECLR_*", "COMPlus_*", "GIT_*", "LESSOPEN", "LESSCLOSE", "LESSKEY*",
        "OPENSSL_*", "PHP*", "TCLLIBPATH", "GEM_*", "R_PROFILE*", "R_ENVIRON*", "EDITOR", "VISUAL",
        "PAGER", "MANPAGER", "BROWSER", "SSH_ASKPASS", "SUDO_ASKPASS", "*_OPTIONS", "*_OPTS",
    )),
)  # fmt: skip

# Device numbers from the kernel's Documentation/admin-guide/devices.txt; driver names as the
# kernel writes them in /proc/devices.
DEVICE_RULES = (
    Rule("device.memory", "physical memory and I/O ports",
         ("/dev/mem", "/dev/kmem", "/dev/port"), ("c 1:1", "c 1:2", "c 1:4")),
    Rule("device.kmsg", "the kernel's log (read it, or forge lines in it)", ("/dev/kmsg",), ("c 1:11",)),
    Rule("device.terminal", "the host's terminals and consoles (keystrokes into the host's sessions)",
         ("/dev/pts/**", "/dev/ptmx", "/dev/tty", *(f"/dev/tty{n}" for n in range(64)), "/dev/ttyS*",
          "/dev/console", "/dev/vcs*", "/dev/vc/**"),
         ("c 4:*", "c 5:*", "c 7:*", "c 128:*", "c 136:*", "c 137:*", "c 138:*", "c 139:*", "c 140:*",
          "c 141:*", "c 142:*", "c 143:*"),
         ("tty", "ttyS", "/dev/tty", "/dev/console", "/dev/ptmx", "/dev/vc/0", "vcs", "ptm", "pts")),
    Rule("device.input", "keyboards and mice (read or inject keystrokes)",
         ("/dev/input/**", "/dev/uinput", "/dev/hidraw*"), ("c 13:*", "c 10:223"), ("input", "hidraw")),
    Rule("device.flash", "raw flash (the node's firmware)", ("/dev/mtd*",), ("c 90:*", "b 31:*"), ("mtd",)),
    Rule("device.tpm", "the node's TPM (its keys and measurements)",
         ("/dev/tpm*", "/dev/tpmrm*"), ("c 10:224",), ("tpm", "tpmrm")),
    Rule("device.watchdog", "the watchdog (the node reboots when it is closed wrongly)",
         ("/dev/watchdog*",), ("c 10:130",), ("watchdog",)),
    Rule("device.scsi", "SCSI generic and block SCSI generic (raw commands to any disk)",
         ("/dev/sg*", "/dev/bsg/**", "/dev/bsg"), ("c 21:*",), ("sg", "bsg")),
    Rule("device.disk_control", "device-mapper's and loop's control nodes (a block device from any disk)",
         ("/dev/mapper/control", "/dev/loop-control"), ("c 10:236", "c 10:237")),
    Rule("device.cpu", "CPU model-specific registers and CPUID", ("/dev/cpu/**",),
         ("c 202:*", "c 203:*"), ("cpu/msr", "cpu/cpuid")),
    Rule("device.snapshot", "the hibernation image (all of memory)", ("/dev/snapshot",), ("c 10:231",)),
)  # fmt: skip

MOUNT_RULES = (
    Rule("mount.root", "the host's root", ("/",)),
    Rule("mount.kernel", "the kernel's interfaces and every device node",
         ("/proc", "/proc/**", "/sys", "/sys/**", "/dev", "/dev/**")),
    Rule("mount.secrets", "credentials: service account tokens, the kubelet's pods and keys, root's home",
         ("/var/run/secrets", "/var/run/secrets/**", "/run/secrets", "/run/secrets/**", "/var/lib/kubelet",
          "/var/lib/kubelet/**", "/etc/kubernetes", "/etc/kubernetes/**", "/root", "/root/**", "/etc/shadow",
          "/etc/gshadow", "/etc/sudoers", "/etc/sudoers.d/**", "/etc/ssh/**")),
    Rule("mount.runtime", "the container runtime's sockets and state (root on the node)",
         ("/run/containerd", "/run/containerd/**", "/var/run/containerd", "/var/run/containerd/**",
          "/run/crio", "/run/crio/**", "/var/run/crio/**", "/run/docker.sock", "/var/run/docker.sock",
          "/var/lib/containerd/**", "/var/lib/docker/**")),
)  # fmt: skip

# Container paths of mounts and device nodes: the loader's and the system's own files (a mount at
# /etc/ld.so.preload is LD_PRELOAD by another name), and the kernel's interfaces.
CONTAINER_PATH_RULE = Rule(
    "container_path.system",
    "the container's root, or a loader or system location",
    tuple(
        pattern
        for top in (
            "/etc",
            "/lib",
            "/lib32",
            "/lib64",
            "/libx32",
            "/usr",
            "/bin",
            "/sbin",
            "/boot",
            "/proc",
            "/sys",
        )
        for pattern in (top, f"{top}/**")
    )
    + ("/",),
)

RULES = {rule.name: rule for rule in (*ENV_RULES, *DEVICE_RULES, *MOUNT_RULES, CONTAINER_PATH_RULE)}


def _env_regex(pattern: str) -> str:
    return ".*".join(re.escape(part) for part in pattern.split("*"))


class Floor:
    """The floor's rules less those lifted; ``*_rule`` returns the rule a value breaks, if any."""

    def __init__(self, lifted: Iterable[str]) -> None:
        lifted = set(lifted)
        self.lifted = tuple(sorted(lifted))
        self._env = self._compile((r for r in ENV_RULES if r.name not in lifted), _env_regex)
        self._device = self._compile((r for r in DEVICE_RULES if r.name not in lifted), glob_regex)
        self._mount = self._compile((r for r in MOUNT_RULES if r.name not in lifted), glob_regex)
        # What each mount rule guards, as directories: a mount of one of them, or of a directory
        # above one, holds what the rule guards (the rules' patterns are literal up to "/**").
        self._guarded = [
            (literal_head(p), r) for r in MOUNT_RULES if r.name not in lifted for p in r.patterns
        ]
        self._container = (
            None if CONTAINER_PATH_RULE.name in lifted else self._compile([CONTAINER_PATH_RULE], glob_regex)
        )
        numbers: dict[tuple[int, int | None, int | None], Rule] = {}
        names: dict[tuple[int, str], Rule] = {}
        for rule in DEVICE_RULES:
            if rule.name in lifted:
                continue
            for entry in rule.numbers:
                kind, _, pair = entry.partition(" ")
                major, _, minor = pair.partition(":")
                file_type = stat.S_IFCHR if kind == "c" else stat.S_IFBLK
                numbers[(file_type, int(major), None if minor == "*" else int(minor))] = rule
            for driver in rule.drivers:
                names[(stat.S_IFCHR, driver)] = rule
        self._numbers = numbers
        self._names = names

    @staticmethod
    def _compile(
        rules: Iterable[Rule], translate: Callable[[str], str]
    ) -> list[tuple[re.Pattern[str], Rule]]:
        return [(re.compile("|".join(f"(?:{translate(p)})" for p in r.patterns)), r) for r in rules]

    @staticmethod
    def _first(compiled: list[tuple[re.Pattern[str], Rule]] | None, value: str) -> Rule | None:
        for pattern, rule in compiled or ():
            if pattern.fullmatch(value):
                return rule
        return None

    def env_rule(self, name: str) -> Rule | None:
        return self._first(self._env, name)

    def device_path_rule(self, path: str) -> Rule | None:
        return self._first(self._device, path)

    def device_number_rule(self, kind: int, major: int, minor: int, drivers: Iterable[str]) -> Rule | None:
        rule = self._numbers.get((kind, major, minor)) or self._numbers.get((kind, major, None))
        if rule is not None:
            return rule
        return next((r for d in drivers if (r := self._names.get((kind, d))) is not None), None)

    def node_rule(self, found: os.stat_result | None, looks: Looks) -> Rule | None:
        """The rule the device node ``found`` (what is at a path) breaks by its number, or by
        the kernel driver that holds its major."""
        if found is None or not (stat.S_ISCHR(found.st_mode) or stat.S_ISBLK(found.st_mode)):
            return None
        kind, major = stat.S_IFMT(found.st_mode), os.major(found.st_rdev)
        return self.device_number_rule(kind, major, os.minor(found.st_rdev), looks.driver_names(kind, major))

    def mount_rule(self, path: str) -> Rule | None:
        """The rule a mount of ``path`` breaks: it matches one, or holds what one guards."""
        below = path.rstrip("/") + "/"
        return self._first(self._mount, path) or next(
            (rule for guarded, rule in self._guarded if guarded == path or guarded.startswith(below)),
            None,
        )

    def container_path_rule(self, path: str) -> Rule | None:
        return self._first(self._container, path)
