"""A direct pytest run holds its reports folder for its session (harness/plugin/reports_hold.py):
a second direct run, or a ``hil`` command, into the same folder is refused at its start
naming the holder (pytest: exit 4), and the first run's outputs are untouched; a run into
another folder goes ahead; a --collect-only run neither takes the lock nor is refused."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.core.paths import REPO_ROOT
from harness.staging.run_folder import ReportsBusy, lock_holder, reports_lock

USAGE = 4
PLUGINS = ("harness.plugin.hooks", "harness.plugin.fixtures", "harness.plugin.allure_report")
# A test that runs until the test tells it to end (or 120 s pass): the first run is in its
# session, holding its reports folder, while the second starts.
WAITING_TEST = """
import os, time
from pathlib import Path

def test_waits_for_go():
    go = Path(os.environ["HOLD_GO"])
    end = time.monotonic() + 120
    while not go.exists() and time.monotonic() < end:
        time.sleep(0.1)
    assert go.exists()
"""


def pytest_cmd(tmp_path: Path, reports: Path, *args: str) -> list[str]:
    # The plugin loaded as this repository's conftest loads it (the test file is outside it).
    plugins = [a for m in PLUGINS for a in ("-p", m)]
    return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-p", "no:xdist",
            *plugins, str(tmp_path / "test_waits.py"), f"--rootdir={REPO_ROOT}", "-c",
            str(REPO_ROOT / "pyproject.toml"), f"--hil-reports-dir={reports}",
            f"--lease-dir={tmp_path / 'leases'}", *args]


def env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "HOLD_GO": str(tmp_path / "go"),
            "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}


@pytest.fixture
def first_run(tmp_path):
    """A direct pytest run into tmp_path/reports, in its session (its test waits for ``go``)."""
    (tmp_path / "test_waits.py").write_text(WAITING_TEST, encoding="utf-8")
    reports = tmp_path / "reports"
    first = subprocess.Popen(pytest_cmd(tmp_path, reports), cwd=REPO_ROOT, env=env(tmp_path),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        end = time.monotonic() + 120
        while lock_holder(reports) is None and first.poll() is None and time.monotonic() < end:
            time.sleep(0.1)
        assert lock_holder(reports) is not None, "the first run did not take the lock"
        yield first, reports
    finally:
        (tmp_path / "go").touch()
        try:
            first.wait(timeout=120)
        finally:
            if first.poll() is None:
                first.kill()


def finish(first: subprocess.Popen, tmp_path: Path) -> str:
    (tmp_path / "go").touch()
    out, _ = first.communicate(timeout=120)
    assert first.returncode == 0, out[-3000:]
    return out


def test_a_second_direct_run_into_the_same_reports_folder_is_refused(tmp_path, first_run):
    first, reports = first_run
    holder = lock_holder(reports)
    assert f"pid {first.pid} on " in holder and "(`pytest -p no:cacheprovider -q" in holder
    second = subprocess.run(pytest_cmd(tmp_path, reports), cwd=REPO_ROOT, env=env(tmp_path),
                            capture_output=True, text=True, timeout=300)
    out = second.stdout + second.stderr
    assert second.returncode == USAGE, out[-3000:]
    assert (f"ERROR: --hil-reports-dir {reports}: in use by pid {first.pid} on " in out
            and "(`pytest -p no:cacheprovider -q" in out), out[-3000:]
    assert "wait for it to finish, or pass another --hil-reports-dir" in out
    assert "Traceback" not in out and len(out.splitlines()) <= 5, out
    # A hil command is refused by it as well, naming the run.
    with pytest.raises(ReportsBusy, match=f"in use by pid {first.pid} on .*`pytest "):
        with reports_lock(reports, "hil run -m cpu"):
            pass
    finish(first, tmp_path)
    # The first run's outputs are its own, and it released the lock.
    assert (reports / "timing.json").is_file()
    assert lock_holder(reports) is None and not (reports / ".hil-lock.holder").exists()


def test_a_run_into_another_reports_folder_goes_ahead(tmp_path, first_run):
    first, reports = first_run
    (tmp_path / "go").touch()  # the second run's test ends at once
    other = tmp_path / "other-reports"
    second = subprocess.run(pytest_cmd(tmp_path, other), cwd=REPO_ROOT, env=env(tmp_path),
                            capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, (second.stdout + second.stderr)[-3000:]
    assert (other / "timing.json").is_file()
    finish(first, tmp_path)
    assert (reports / "timing.json").is_file()


def test_a_collect_only_run_is_not_refused_and_takes_no_lock(tmp_path, first_run):
    first, reports = first_run
    listed = subprocess.run(pytest_cmd(tmp_path, reports, "--collect-only"), cwd=REPO_ROOT,
                            env=env(tmp_path), capture_output=True, text=True, timeout=300)
    assert listed.returncode == 0, (listed.stdout + listed.stderr)[-3000:]
    assert "test_waits_for_go" in listed.stdout
    assert f"pid {first.pid} on " in lock_holder(reports)  # still the first run's
    finish(first, tmp_path)
    assert lock_holder(reports) is None


def test_a_hil_run_child_in_its_staging_folder_takes_no_lock(tmp_path):
    (tmp_path / "test_waits.py").write_text(WAITING_TEST, encoding="utf-8")
    (tmp_path / "go").touch()
    reports = tmp_path / "reports"
    staging = reports / ".run-20260101-000000-1"
    staging.mkdir(parents=True)
    with reports_lock(reports, "hil run -m cpu"):
        child = subprocess.run(pytest_cmd(tmp_path, staging), cwd=REPO_ROOT, env=env(tmp_path),
                               capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, (child.stdout + child.stderr)[-3000:]
    assert not (staging / ".hil-lock").exists()  # the parent's folder: it took none of its own
