"""The lab's CI definitions (lab/ci/): each validates against its published schema with a
maintained validator (check-jsonschema's vendored GitHub workflow and GitLab CI schemas,
kubernetes-validate's bundled Kubernetes schemas; all offline), a broken copy of each is
rejected, and every `hil` command in them is one the lab guide (docs/lab.md) shows and the CLI accepts."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import harness.cli as cli
import harness.selftest as selftest
from harness.core.paths import REPO_ROOT

ROOT = REPO_ROOT
CI = ROOT / "lab" / "ci"
GITHUB = CI / "github" / "hil-nightly.yml"
GITLAB = CI / "gitlab" / "hil-nightly.gitlab-ci.yml"
K8S = sorted((CI / "kubernetes").glob("*.yaml"))
K8S_VERSION = "1.33.0"  # the oldest Kubernetes the definitions are checked against
MISSING = "not installed: it is pinned in requirements/stack-default.in; run ./setup.sh"


def check_jsonschema(schema: str, path: Path) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("check_jsonschema", reason=f"check-jsonschema {MISSING}")
    return subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", schema,
                           str(path)], capture_output=True, text=True, timeout=120)


def kubernetes_validate(*paths: Path) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("kubernetes_validate", reason=f"kubernetes-validate {MISSING}")
    return subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", "-k",
                           K8S_VERSION, *map(str, paths)], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("schema, path", [("vendor.github-workflows", GITHUB),
                                          ("vendor.gitlab-ci", GITLAB)])
def test_ci_definition_validates_and_a_broken_copy_does_not(tmp_path, schema, path):
    ok = check_jsonschema(schema, path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    broken = tmp_path / path.name
    data = yaml.safe_load(path.read_text())
    job = next(iter(data["jobs"].values())) if "jobs" in data else data["hil-nightly"]
    job["parallel" if "jobs" not in data else "strategy"] = "three"  # not an int / a mapping
    broken.write_text(yaml.safe_dump(data))
    bad = check_jsonschema(schema, broken)
    assert bad.returncode != 0, bad.stdout


def test_kubernetes_definitions_validate_and_a_broken_copy_does_not(tmp_path):
    assert K8S, "no Kubernetes definitions in lab/ci/kubernetes"
    ok = kubernetes_validate(*K8S)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    docs = list(yaml.safe_load_all((CI / "kubernetes" / "hil-nightly.yaml").read_text()))
    job = next(d for d in docs if d["kind"] == "Job")
    assert job["spec"]["completionMode"] == "Indexed"
    job["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []  # a misspelt field
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(job))
    bad = kubernetes_validate(broken)
    assert bad.returncode != 0, bad.stdout


def _strings(node):
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for v in node.values():
            yield from _strings(v)
    elif isinstance(node, list):
        for v in node:
            yield from _strings(v)


def hil_commands(path: Path) -> list[str]:
    """Every `.venv/bin/hil ...` command in a definition, as written."""
    found = []
    for doc in yaml.safe_load_all(path.read_text()):
        for text in _strings(doc):
            for line in text.splitlines():
                m = re.search(r"\.venv/bin/hil [^;|&>]*", line)
                if m:
                    found.append(m.group(0).strip())
    return found


def _concrete(command: str) -> list[str]:
    """The command with CI variables filled in (shard 1 of N)."""
    text = re.sub(r"\$\{\{[^}]*\}\}|\$\{\w+\}|\$\w+", "1", command)
    return shlex.split(text)[1:]


@pytest.mark.parametrize("path", [GITHUB, GITLAB, *K8S], ids=lambda p: p.name)
def test_ci_commands_are_the_lab_guides_and_the_cli_accepts_them(monkeypatch, path):
    commands = hil_commands(path)
    assert commands, f"no hil command in {path}"
    guide = (ROOT / "docs" / "lab.md").read_text()
    calls: list[tuple[str, list[str]]] = []
    for name in ("cmd_nightly", "cmd_report"):
        monkeypatch.setattr(cli, name, lambda a, extra, n=name: calls.append((n, extra)) or 0)
    monkeypatch.setattr(selftest, "selftest_command",
                        lambda a, extra: calls.append(("selftest", extra)) or 0)
    for command in commands:
        assert command in guide, f"{path.name}: {command!r} is not in the lab guide (docs/lab.md)"
        calls.clear()
        assert cli.main(_concrete(command)) == 0
        assert len(calls) == 1 and calls[0][1] == [], (command, calls)  # nothing left over


@pytest.mark.parametrize("paths", [[GITHUB], [GITLAB], K8S], ids=["github", "gitlab", "kubernetes"])
def test_each_ci_runs_the_shards_their_selftest_and_one_merge(paths):
    commands = [c for p in paths for c in hil_commands(p)]
    assert sorted(shlex.split(c)[1] for c in commands) == ["nightly", "report", "selftest"]
    nightly = next(c for c in commands if " nightly " in c)
    assert "--shard" in nightly and "--shard-durations" in nightly
