"""The run's output folders: the previous run's statistics (and, for ``hil run``, results)
removed once the arguments are accepted, and the run's timing written at its end."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import psutil
import pytest

from harness.plugin.invocation import is_worker, writes_nothing
from harness.plugin.options import option_value

_TIMES: dict[str, float] = {}


def empty_folder(folder: Path) -> None:
    """Remove what ``folder`` holds, keeping the folder (allure-pytest already opened it)."""
    if not folder.is_dir():
        return
    for child in folder.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def clean_previous_outputs(config: pytest.Config) -> None:
    if is_worker(config) or writes_nothing(config):
        return
    # Only now that every argument is accepted: stale per-worker statistics and
    # broken-device records of an earlier run must go, and (for hil run) the results.
    reports = Path(option_value(config, "--hil-reports-dir"))
    shutil.rmtree(reports / "stats", ignore_errors=True)
    shutil.rmtree(reports / "devices", ignore_errors=True)
    alluredir = getattr(config.option, "allure_report_dir", None)
    if option_value(config, "--hil-clean-results") and alluredir:
        empty_folder(Path(alluredir))


def mark_time(event: str) -> None:
    _TIMES[event] = time.time()


def write_timing(config: pytest.Config) -> None:
    """REPORTS_DIR/timing.json: when the process, the session and its collection started and
    when the session finished (the benchmark's split of a run)."""
    if is_worker(config) or writes_nothing(config):
        return
    mark_time("session_finish")
    _TIMES["process_start"] = psutil.Process().create_time()
    out = Path(option_value(config, "--hil-reports-dir"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "timing.json").write_text(json.dumps(_TIMES))
