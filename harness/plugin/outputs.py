"""The run's output folders: the previous run's statistics (and, with --hil-clean-results,
results) removed when the run is about to run its first test (``begin_run``): not before, so a
run refused at configure or at collection (a bad argument, a stale quarantine entry under
--strict-quarantine, under xdist too) loses nothing of the earlier run and writes nothing
(``run_begun``); and the run's timing written at its end.
``hil run`` gives pytest a fresh folder of its own, so it passes no --hil-clean-results; a
direct pytest run with it empties its --alluredir as before.

And SIGTERM and SIGHUP (a closed terminal; also the signal a pytest started by ``hil`` gets when
``hil`` dies): in the main pytest process (not an xdist worker) each ends the session as a Ctrl-C
does, so a stopped run writes its junit, results and summary and stops its engines."""

from __future__ import annotations

import json
import shutil
import signal
import threading
import time
from pathlib import Path
from types import FrameType

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


RUN_BEGUN = pytest.StashKey[bool]()


def run_begun(config: pytest.Config) -> bool:
    """Whether this run reached its tests (``begin_run``): only such a run reports."""
    return config.stash.get(RUN_BEGUN, False)


def begin_run(config: pytest.Config) -> None:
    """Once, before the first test runs (the controller alone): the earlier run's per-worker
    statistics and broken-device records go, and with --hil-clean-results its results."""
    if is_worker(config) or writes_nothing(config) or run_begun(config):
        return
    config.stash[RUN_BEGUN] = True
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
    if is_worker(config) or not run_begun(config):
        return
    mark_time("session_finish")
    _TIMES["process_start"] = psutil.Process().create_time()
    out = Path(option_value(config, "--hil-reports-dir"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "timing.json").write_text(json.dumps(_TIMES))


# Ended as a Ctrl-C: SIGHUP as SIGTERM, so a closed terminal keeps what the run recorded.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _sigterm(signum: int, frame: FrameType | None) -> None:
    name = signal.Signals(signum).name
    if signum == signal.SIGHUP:
        # Writes to a hung-up terminal fail; the session's end must not fail with them.
        from harness.staging.interrupt import quiet_hung_up_terminal

        quiet_hung_up_terminal()
    raise KeyboardInterrupt(f"signal {signum} ({name})")


def end_on_sigterm(config: pytest.Config) -> None:
    """SIGTERM and SIGHUP raise KeyboardInterrupt in the main process while the session runs
    (each only where nothing else handles it); the default handler comes back when the session
    ends."""
    if is_worker(config) or threading.current_thread() is not threading.main_thread():
        return
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_DFL:
            continue
        signal.signal(sig, _sigterm)
        config.add_cleanup(lambda sig=sig: signal.signal(sig, signal.SIG_DFL))
