"""What a soak run saw: faults by kind, kubelet calls and why they failed, lists, recovery times,
and every invariant violation; as a JSON document and as text."""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Violation:
    invariant: str  # device_missing, hung_call, unclear_error, no_recovery, slow_recovery, ...
    at_s: float  # seconds into the run
    fault: str  # the fault in progress, or the last one injected
    detail: str


@dataclass
class Calls:
    """One kubelet method's calls to devshim: answered OK, failed (by code and reason), or never
    made because the kubelet itself refused (no registered plugin, no Healthy device)."""

    ok: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)
    seconds: list[float] = field(default_factory=list)

    @property
    def made(self) -> int:
        return self.ok + sum(self.failed.values())

    def as_json(self) -> dict[str, Any]:
        return {
            "made": self.made,
            "ok": self.ok,
            "failed": sum(self.failed.values()),
            "failed_by_reason": dict(self.failed.most_common()),
            "refused_by_the_kubelet": dict(self.refused.most_common()),
            "slowest_s": round(max(self.seconds, default=0.0), 3),
            "p99_s": round(percentile(self.seconds, 99), 3),
        }


@dataclass
class FaultKind:
    injected: int = 0
    overlapped: int = 0  # followed by another fault before it had recovered
    variants: Counter[str] = field(default_factory=Counter)
    recoveries: list[float] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "injected": self.injected,
            "recoveries_timed": len(self.recoveries),
            "overlapped": self.overlapped,
            "recovery_max_s": round(max(self.recoveries, default=0.0), 3),
            "recovery_p99_s": round(percentile(self.recoveries, 99), 3),
            "recovery_p50_s": round(percentile(self.recoveries, 50), 3),
            "variants": dict(sorted(self.variants.items())),
        }


def percentile(samples: list[float], q: float) -> float:
    if not samples:
        return 0.0
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


_NOISE = (
    (re.compile(r"/tmp/\S+"), "<path>"),
    (re.compile(r"-[0-9a-f]{6}\.sock"), "-<instance>.sock"),
    (re.compile(r"\b(pid|ipv4|ipv6|port) ?\d+"), r"\1 N"),
    (re.compile(r"\d+(\.\d+)?"), "N"),
)


def reason(text: str) -> str:
    """A failure's text with paths and numbers blanked, so equal causes count together."""
    for pattern, replacement in _NOISE:
        text = pattern.sub(replacement, text)
    return text.strip()[:200]


class Journal:
    """Filled by the faults and the invariant checkers while the soak runs."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.fault = "none yet"
        self.violations: list[Violation] = []
        self.faults: dict[str, FaultKind] = {}
        self.calls: dict[str, Calls] = {}
        self.lists = 0
        self.grants = 0
        self.figures: dict[str, list[float]] = {}  # other timings worth reporting, by name

    def figure(self, name: str, seconds: float) -> None:
        self.figures.setdefault(name, []).append(seconds)

    def now(self) -> float:
        return round(time.monotonic() - self.started, 3)

    def violate(self, invariant: str, detail: str) -> None:
        self.violations.append(Violation(invariant, self.now(), self.fault, detail))

    def calls_of(self, method: str) -> Calls:
        return self.calls.setdefault(method, Calls())

    def kind(self, name: str) -> FaultKind:
        return self.faults.setdefault(name, FaultKind())

    def report(self, **extra: Any) -> dict[str, Any]:
        recoveries = [r for kind in self.faults.values() for r in kind.recoveries]
        return {
            **extra,
            "duration_s": self.now(),
            "passed": not self.violations,
            "faults_injected": sum(kind.injected for kind in self.faults.values()),
            "faults": {name: kind.as_json() for name, kind in sorted(self.faults.items())},
            "calls": {name: calls.as_json() for name, calls in sorted(self.calls.items())},
            "lists_received": self.lists,
            "grants_checked": self.grants,
            "recovery_max_s": round(max(recoveries, default=0.0), 3),
            "recovery_p99_s": round(percentile(recoveries, 99), 3),
            "figures": {name: _figure(values) for name, values in sorted(self.figures.items())},
            "violations": [asdict(v) for v in self.violations],
        }


def _figure(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "max_s": round(max(values), 3), "p50_s": round(percentile(values, 50), 3)}


def render(report: dict[str, Any]) -> str:
    """The report as text for a terminal."""
    verdict = "PASSED" if report["passed"] else f"FAILED: {len(report['violations'])} invariant violations"
    lines = [
        f"soak: {report['faults_injected']} faults in {report['duration_s']:.0f} s "
        f"(seed {report.get('seed')}): {verdict}",
        "",
        f"{'fault':<22} {'injected':>8} {'timed':>6} {'max s':>7} {'p99 s':>7} {'p50 s':>7}  variants",
    ]
    for name, kind in report["faults"].items():
        variants = ", ".join(f"{v} {n}" for v, n in kind["variants"].items())
        lines.append(
            f"{name:<22} {kind['injected']:>8} {kind['recoveries_timed']:>6} {kind['recovery_max_s']:>7.3f} "
            f"{kind['recovery_p99_s']:>7.3f} {kind['recovery_p50_s']:>7.3f}  {variants}"
        )
    lines.append(f"recovery: max {report['recovery_max_s']:.3f} s, p99 {report['recovery_p99_s']:.3f} s")
    for name, figure in report["figures"].items():
        lines.append(f"{name}: max {figure['max_s']:.3f} s, p50 {figure['p50_s']:.3f} s (n={figure['n']})")
    lines.append(f"ListAndWatch lists received and checked: {report['lists_received']}")
    lines.append(f"Allocate grants checked against the policies: {report['grants_checked']}")
    for method, calls in report["calls"].items():
        lines.append(
            f"{method}: {calls['made']} calls, {calls['ok']} OK, {calls['failed']} failed; "
            f"slowest {calls['slowest_s']:.3f} s, p99 {calls['p99_s']:.3f} s"
        )
        lines += [f"  failed {n:>5}  {why}" for why, n in calls["failed_by_reason"].items()]
        lines += [f"  refused {n:>4}  {why}" for why, n in calls["refused_by_the_kubelet"].items()]
    for v in report["violations"]:
        lines.append(f"VIOLATION {v['invariant']} at {v['at_s']:.1f} s during {v['fault']}: {v['detail']}")
    return "\n".join(lines)
