"""deploy/examples/compat: the GitHub Actions matrix and the Kubernetes Indexed Job that spread
`devshim compat --shard I/N` over machines (docs/compat.md, "Across machines"). Each names every
shard 1..N exactly once, writes a report per shard where its merge step reads them, and the Job's
objects are valid Kubernetes; the Job's shell line is run by sh for every completion index."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import yaml

from tests.deploy.test_manifests import validate_strictly
from tests.deploy.tools import DEPLOY

EXAMPLES = DEPLOY / "examples" / "compat"


def load_all(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]


def test_the_indexed_job_runs_each_shard_once_and_validates() -> None:
    docs = load_all(EXAMPLES / "indexed-job.yaml")
    version = kubernetes_validate.latest_version()
    for doc in docs:
        validate_strictly(doc, version)
    (job,) = [d for d in docs if d["kind"] == "Job"]
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"]
    (container,) = spec["template"]["spec"]["containers"]
    assert container["command"] == ["sh", "-c"]
    (line,) = container["args"]
    # The shell line as the pod runs it, devshim's arguments printed instead of run.
    shown = line.replace("exec devshim compat", "printf '%s\\n'", 1)
    shards, reports = [], []
    for index in range(spec["completions"]):
        env = {"JOB_COMPLETION_INDEX": str(index), "PATH": "/usr/bin:/bin"}
        args = subprocess.run(["sh", "-c", shown], capture_output=True, text=True, env=env, check=True)
        argv = args.stdout.splitlines()
        shards.append(argv[argv.index("--shard") + 1])
        reports.append(argv[argv.index("--json") + 1])
    count = spec["completions"]
    assert sorted(shards) == [f"{i}/{count}" for i in range(1, count + 1)]
    (mount,) = container["volumeMounts"]
    assert all(Path(r).parent == Path(mount["mountPath"]) for r in reports) and len(set(reports)) == count
    claim = spec["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"]
    assert claim in {d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim"}
    merge = (EXAMPLES / "indexed-job.yaml").read_text(encoding="utf-8")
    assert f"devshim compat merge {mount['mountPath']}/shard-*.json" in merge


def test_the_github_matrix_runs_each_shard_once_and_merges_them_all() -> None:
    (workflow,) = load_all(EXAMPLES / "github-actions.yaml")
    shard_job, merge_job = workflow["jobs"]["shard"], workflow["jobs"]["merge"]
    values = shard_job["strategy"]["matrix"]["shard"]
    runs = " ".join(step.get("run", "") for step in shard_job["steps"])
    found = re.search(r"--shard \$\{\{ matrix\.shard \}\}/(\d+)", runs)
    assert found is not None, runs
    assert values == list(range(1, int(found[1]) + 1))
    assert shard_job["strategy"]["fail-fast"] is False  # a failed cell must not cancel the others
    assert "--json shard-${{ matrix.shard }}.json" in runs
    (merge,) = [s["run"] for s in merge_job["steps"] if "compat merge" in s.get("run", "")]
    assert shlex.split(merge)[:4] == ["devshim", "compat", "merge", "shard-*.json"]
    assert merge_job["needs"] == "shard" and merge_job["if"] == "always()"
