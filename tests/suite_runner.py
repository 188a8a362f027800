"""Run a suite of this repo in a child pytest, for tests that prove a suite fails."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.plugin.outputs import RUN_BEGUN
from harness.stacks.spec import stack_python

ROOT = Path(__file__).resolve().parent.parent

# vllm-spyre 1.x (its own CB runner pool, reservations, static and continuous batching) lives
# on in its own stack: a child pytest given SPYRE_1X runs its engines there. The default stack
# carries sendnn-inference 2.x, whose decoders only have the chunked-prefill modes (cp, pc).
SPYRE_1X_STACK = "spyre-1.10"
SPYRE_1X = ("--stack", SPYRE_1X_STACK)
needs_spyre_1x = pytest.mark.skipif(
    stack_python(SPYRE_1X_STACK) is None,
    reason=f"stack {SPYRE_1X_STACK} is not installed: run ./setup.sh --stack {SPYRE_1X_STACK}",
)

# A child pytest outside this checkout loads the harness as this checkout's modules: the
# installed copy's pytest11 entry points are blocked, or the plugin would register twice.
CHECKOUT_PLUGINS = ["-p", "no:vllm_hil", "-p", "no:vllm_hil_allure",
                    "-p", "harness.plugin.hooks", "-p", "harness.plugin.fixtures",
                    "-p", "harness.plugin.allure_report"]


# Plugins the suites do not use, not loaded by the child runs (about half a second each).
CHILD_PLUGINS_OFF = ("-p", "no:hypothesispytest")


@dataclass
class SuiteRun:
    returncode: int
    output: str
    outcomes: dict[str, str]  # test name -> passed/failed/skipped/error
    messages: dict[str, str]  # test name -> failure text
    properties: dict[str, dict[str, str]]  # test name -> recorded properties

    def failed(self) -> list[str]:
        return [k for k, v in self.outcomes.items() if v in ("failed", "error")]

    def check(self, name: str) -> str | None:
        """The check whose verdict failed test ``name`` (the ``[check NAME]`` tag)."""
        m = re.search(r"\[check ([\w.]+)\]", self.messages.get(name, "").split("\n")[0])
        return m.group(1) if m else None

    def category(self, name: str) -> str | None:
        """The report category of test ``name``, filed as the report files it."""
        from harness.report.categories import classify

        status = {"failed": "failed", "error": "broken", "skipped": "skipped"}.get(
            self.outcomes.get(name, ""), "passed")
        first = self.messages.get(name, "").lstrip("\n").split("\n")[0]
        return classify(status, first, check=self.check(name))

    def named(self, fragment: str) -> str:
        """The one test whose name contains ``fragment``."""
        (name,) = [n for n in self.outcomes if fragment in n]
        return name


def run_suite(tmp_path: Path, *args: str, timeout: float = 1200,
              env: dict[str, str] | None = None) -> SuiteRun:
    """Run pytest on ``args`` in a child process with its own reports folder; ``env``
    adds to (or overrides) this process's environment."""
    junit = tmp_path / "junit.xml"
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
           *CHILD_PLUGINS_OFF, "-o", "junit_family=xunit1",  # keeps per-test properties (the leased device)
           f"--junitxml={junit}", f"--hil-reports-dir={tmp_path / 'reports'}",
           f"--lease-dir={tmp_path / 'leases'}", *args]
    if not any(a.startswith("--triage") for a in args):
        cmd.append("--no-triage")  # a run that proves a check fails; a triage test opts in
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=None if env is None else {**os.environ, **env})
    outcomes: dict[str, str] = {}
    messages: dict[str, str] = {}
    properties: dict[str, dict[str, str]] = {}
    if junit.exists():
        for case in ET.parse(junit).getroot().iter("testcase"):
            name = case.get("name", "")
            properties[name] = {p.get("name", ""): p.get("value", "") for p in case.iter("property")}
            outcome = "passed"
            for tag in ("failure", "error", "skipped"):
                el = case.find(tag)
                if el is not None:
                    outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                    messages[name] = (el.get("message") or "") + "\n" + (el.text or "")
                    break
            outcomes[name] = outcome
    return SuiteRun(proc.returncode, proc.stdout + proc.stderr, outcomes, messages, properties)


def run_with_allure(tmp_path: Path, suite: Path) -> tuple[subprocess.CompletedProcess, Path]:
    """Run ``suite`` (a test file using the ``hil`` fixture) in a child pytest with the
    checkout's plugins and an allure results folder; (the process, the results folder)."""
    results = tmp_path / "allure-results"
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *CHECKOUT_PLUGINS,
           f"--alluredir={results}", f"--hil-reports-dir={tmp_path / 'reports'}",
           f"--hil-cache-dir={tmp_path / 'cache'}", str(suite)]
    run = subprocess.run(cmd, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                         capture_output=True, text=True, timeout=300)
    return run, results


class Reporter:
    """A terminal reporter that keeps the lines the terminal summary writes."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.stats: dict = {}

    def section(self, title: str) -> None:
        self.lines.append(title)

    def write_line(self, line: str, **markup: object) -> None:
        self.lines.append(line)


def config_for(reports: Path) -> object:
    """A pytest config with the two options the terminal summary reads."""

    class Config:
        option = type("Option", (), {})()
        stash = {RUN_BEGUN: True}  # a run that reached its tests

        def getoption(self, name: str) -> str:
            return {"--hil-reports-dir": str(reports), "--stack": "default"}[name]

    return Config()
