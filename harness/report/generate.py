"""`hil report`: reports/allure-results -> a static HTML report, offline, with history.

The pinned Allure 2 command line (tools/report, installed by setup.sh with
``npm ci``; it needs Java) turns a *staging* copy of the results into the
report: only readable results and their attachments go in, plus the previous
report's ``history/`` so trends span runs, plus categories.json when the run
did not write one. The results folder itself is never changed. The report is
built beside the old one and swapped in only when generation succeeded, so a
failed generation keeps the previous report and its history.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from harness.core.paths import REPO_ROOT
from harness.report.categories import write_categories
from harness.report.report_output import mark_report, swap_in
from harness.report.results import ResultsFolder, load_results
from harness.report.stack_summary import write_report_summary

TOOL_DIR = REPO_ROOT / "tools" / "report"
TOOL_BIN = TOOL_DIR / "node_modules" / ".bin" / "allure"
GENERATE_TIMEOUT = 600.0


class ReportToolMissing(RuntimeError):
    """The Allure command line or the Java it needs is not installed."""


@dataclass
class ReportOutcome:
    report_dir: Path
    generated: bool
    tests: int = 0
    seconds: float = 0.0
    size_bytes: int = 0
    files: int = 0
    trend_runs: int = 0
    problems: list[str] = field(default_factory=list)
    error: str | None = None
    tool_missing: bool = False

    def describe(self) -> str:
        if not self.generated:
            return f"hil report: no HTML report: {self.error}"
        return (
            f"hil report: {self.report_dir}/index.html: {self.tests} tests, trend of"
            f" {self.trend_runs} run(s), {self.files} files, {self.size_bytes / 1e6:.1f} MB,"
            f" generated in {self.seconds:.1f} s"
        )


def find_tool(env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(allure command, java command); raises ReportToolMissing saying what to install."""
    env = os.environ if env is None else env
    candidates = [env.get("HIL_ALLURE", ""), str(TOOL_BIN), shutil.which("allure") or ""]
    tool = next((c for c in candidates if c and os.access(c, os.X_OK)), None)
    if tool is None:
        raise ReportToolMissing(
            f"the Allure report tool is not installed: looked for $HIL_ALLURE, {TOOL_BIN} and"
            " `allure` on PATH; run ./setup.sh (it runs `npm ci` in tools/report, which pins"
            " allure-commandline) or set HIL_ALLURE to an allure 2 binary"
        )
    java_home = env.get("JAVA_HOME", "")
    if java_home and not os.access(os.path.join(java_home, "bin", "java"), os.X_OK):
        on_path = shutil.which("java", path=env.get("PATH"))
        fix = (f"unset JAVA_HOME to use {on_path} (java on PATH)" if on_path
               else "point it at a Java 11+ installation or run ./setup.sh")
        raise ReportToolMissing(
            f"JAVA_HOME={java_home} has no executable bin/java, and Allure 2 runs java from"
            f" there; {fix}"
        )
    java = (os.path.join(java_home, "bin", "java") if java_home else "") or shutil.which("java", path=env.get("PATH"))
    if not java or not os.access(java, os.X_OK):
        raise ReportToolMissing(
            "Java is not installed, and Allure 2 needs it: looked for $JAVA_HOME/bin/java and"
            " `java` on PATH; run ./setup.sh (it installs Debian's openjdk-17-jre-headless"
            " when java is missing)"
        )
    return tool, java


def _copy_history(previous: Path, staging: Path, problems: list[str]) -> int:
    """Copy the previous report's history files; returns the number of runs in its trend."""
    src = previous / "history"
    if not src.is_dir():
        return 0
    dst = staging / "history"
    dst.mkdir(parents=True, exist_ok=True)
    runs = 0
    for f in sorted(src.glob("*.json")):
        try:
            data = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            problems.append(f"{f}: previous history skipped ({e.__class__.__name__}); trends"
                            " restart from this run")
            continue
        shutil.copy2(f, dst / f.name)
        if f.name == "history-trend.json" and isinstance(data, list):
            runs = len(data)
    return runs


def stage_results(folder: ResultsFolder, staging: Path, previous_report: Path | None) -> list[str]:
    """Fill ``staging`` with the readable results, attachments, configuration and the
    previous report's history; returns problems found on the way."""
    problems: list[str] = []
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    for path in [*folder.results, *folder.containers, *folder.attachments]:
        shutil.copy2(path, staging / path.name)
    for name, path in folder.config.items():
        if name.endswith(".json"):
            try:
                json.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
                problems.append(f"{path}: skipped: not valid JSON ({e.__class__.__name__})")
                continue
        shutil.copy2(path, staging / name)
    if not (staging / "categories.json").exists():
        write_categories(staging)
    if previous_report is not None:
        _copy_history(previous_report, staging, problems)
    return problems


def _dir_size(path: Path) -> tuple[int, int]:
    files = [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files), len(files)


def _trend_runs(report: Path) -> int:
    try:
        data = json.loads((report / "history" / "history-trend.json").read_text())
    except (OSError, json.JSONDecodeError):
        return 0
    return len(data) if isinstance(data, list) else 0


def generate_report(
    results_dir: Path,
    report_dir: Path,
    summary_path: Path | None = None,
    history: bool = True,
    env: Mapping[str, str] | None = None,
) -> ReportOutcome:
    """Build the HTML report of ``results_dir`` into ``report_dir`` (and the markdown
    summary into ``summary_path``). Unreadable result files are skipped and named in
    ``problems``; a missing tool gives ``generated=False`` with the reason in ``error``."""
    results_dir, report_dir = Path(results_dir), Path(report_dir)
    folder = load_results(results_dir)
    outcome = ReportOutcome(report_dir=report_dir, generated=False, tests=len(folder.results),
                            problems=list(folder.problems))
    if summary_path is not None:
        write_report_summary(results_dir, summary_path, folder)
    try:
        tool, java = find_tool(env)
    except ReportToolMissing as e:
        outcome.error, outcome.tool_missing = str(e), True
        return outcome
    report_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = report_dir.parent / f".{report_dir.name}-staging"
    building = report_dir.parent / f".{report_dir.name}-building"
    try:
        return _generate(folder, outcome, (tool, java), (staging, building), history, env)
    finally:
        # A failed or killed generation leaves nothing behind; the previous report stays.
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(building, ignore_errors=True)


def _generate(folder: ResultsFolder, outcome: ReportOutcome, tool_java: tuple[str, str],
              scratch: tuple[Path, Path], history: bool, env: Mapping[str, str] | None
              ) -> ReportOutcome:
    """Stage, run allure generate into ``building``, mark it and swap it in."""
    (tool, java), (staging, building) = tool_java, scratch
    report_dir = outcome.report_dir
    outcome.problems += stage_results(folder, staging, report_dir if history else None)
    shutil.rmtree(building, ignore_errors=True)
    run_env = dict(os.environ if env is None else env)
    run_env["ALLURE_NO_ANALYTICS"] = "true"
    run_env.setdefault("JAVA_HOME", str(Path(os.path.realpath(java)).parent.parent))
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            [tool, "generate", str(staging), "-o", str(building), "--clean"],
            capture_output=True, text=True, timeout=GENERATE_TIMEOUT, env=run_env,
        )
    except subprocess.TimeoutExpired:
        outcome.error = f"allure generate took more than {GENERATE_TIMEOUT:.0f} s; killed it"
        return outcome
    outcome.seconds = time.monotonic() - t0
    if proc.returncode != 0 or not (building / "index.html").is_file():
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-20:])
        outcome.error = (f"allure generate failed (exit {proc.returncode}); the previous report"
                         f" is kept:\n{tail}")
        return outcome
    mark_report(building)
    old = report_dir.parent / f".{report_dir.name}-old"
    shutil.rmtree(old, ignore_errors=True)
    swap_in(building, report_dir, old)
    shutil.rmtree(old, ignore_errors=True)
    outcome.generated = True
    outcome.size_bytes, outcome.files = _dir_size(report_dir)
    outcome.trend_runs = _trend_runs(report_dir)
    return outcome


def serve_report(report_dir: Path, port: int = 0) -> None:
    """Serve ``report_dir`` on 127.0.0.1 until interrupted (Allure 2 pages load their
    data with requests, so file:// does not show them)."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(report_dir))
    with http.server.ThreadingHTTPServer(("127.0.0.1", port), handler) as server:
        print(f"hil report: serving http://127.0.0.1:{server.server_address[1]}/ (Ctrl-C stops)",
              flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass


def report_command(
    results_dir: Path, report_dir: Path, summary_path: Path, history: bool = True,
    serve: bool = False, port: int = 0,
) -> int:
    """`hil report`: 0 when the HTML report was made (problems with single result files
    are printed, not fatal), 2 when the results folder does not exist (nothing is
    changed) or the report tool is missing, 1 when it failed."""
    if not Path(results_dir).is_dir():
        print(f"hil report: {results_dir}: no such results folder; pass --results the"
              " allure-results folder of a run. Nothing was changed", file=sys.stderr)
        return 2
    outcome = generate_report(results_dir, report_dir, summary_path, history=history)
    for problem in outcome.problems:
        print(f"hil report: warning: {problem}", file=sys.stderr)
    print(f"hil report: summary in {summary_path}")
    print(outcome.describe(), file=sys.stdout if outcome.generated else sys.stderr, flush=True)
    if not outcome.generated:
        return 2 if outcome.tool_missing else 1
    if serve:
        serve_report(report_dir, port)
    return 0
