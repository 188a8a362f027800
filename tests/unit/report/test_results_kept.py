"""Results are never destroyed by a run or report that refuses or fails: `hil run` writes into
a fresh folder and publishes it only when the run completed, keeps an interrupted run beside
the published results, and one command at a time holds the reports folder. The rows of
docs/bad-input.md on results are asserted here (the report and merge side in
test_report_kept.py)."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import cli
from harness.core.paths import REPO_ROOT
from harness.staging import staged_run
from harness.staging.run_folder import HOLDER_FILE, os_problem, reports_lock
from tests.bad_input import assert_nothing_lost, earlier_run

SUITE = """
import os
import time

import pytest


def test_passes():
    pass


@pytest.mark.slow
def test_fails():
    assert 0


def test_waits():
    if os.environ.get("HIL_TEST_WAIT"):
        time.sleep(300)
"""


@pytest.fixture
def suites(tmp_path, monkeypatch):
    """A small suite run by `hil run` instead of the repository's (the plugin loaded as the
    repository's conftest loads it)."""
    folder = tmp_path / "suites"
    folder.mkdir()
    (folder / "conftest.py").write_text((REPO_ROOT / "conftest.py").read_text())
    (folder / "test_small.py").write_text(SUITE)
    monkeypatch.setattr(cli, "RUN_SUITES", folder)
    monkeypatch.delenv("HIL_TEST_WAIT", raising=False)
    return folder


def earlier(reports: Path) -> dict[Path, bytes]:
    files = earlier_run(reports)
    for name, data in {"junit.xml": b"<testsuites>earlier</testsuites>",
                       "timing.json": b"{}", "stacks/default/part.json": b"{}",
                       "engine-logs/engine-0.log": b"earlier log"}.items():
        (reports / name).parent.mkdir(parents=True, exist_ok=True)
        (reports / name).write_bytes(data)
        files[reports / name] = data
    return files


def visible(reports: Path) -> list[str]:
    """What the reports folder holds besides the lock files."""
    return sorted(p.name for p in reports.iterdir() if p.name not in (".hil-lock", HOLDER_FILE))


@pytest.mark.parametrize("args, code, message", ids=["marker-typo", "k-nomatch", "collect-only",
                                                     "bad-durations"], argvalues=[
    (["-m", "spyer"], 5, "no test was selected (pytest exit 5"),
    (["-k", "nomatch"], 5, "no test was selected (pytest exit 5"),
    (["--collect-only"], 0, "no test result was recorded (pytest exit 0; --collect-only?)"),
    (["--shard=1/2", "--shard-durations={tmp}/bad.json"], 4,
     "pytest refused the arguments (exit 4)"),
])
def test_a_run_that_records_no_result_publishes_nothing(suites, tmp_path, capfd, args, code,
                                                        message):
    reports = tmp_path / "reports"
    files = earlier(reports)
    (tmp_path / "bad.json").write_text("{not json")
    argv = ["run", "--reports-dir", str(reports), *[a.format(tmp=tmp_path) for a in args]]
    assert cli.main(argv) == code
    err = capfd.readouterr().err
    assert f"hil run: {message}" in err
    assert f"the previous results in {reports} (allure-results/, junit*.xml, summary.md" in err
    assert "nothing of this run was published" in err and "Traceback" not in err
    assert_nothing_lost(files)
    assert visible(reports) == sorted(
        ["allure-results", "allure-report", "devices", "engine-logs", "junit.xml", "stacks",
         "stats", "summary.md", "timing.json"])


def test_collection_errors_publish_nothing(suites, tmp_path, capfd):
    (suites / "test_broken.py").write_text("import nowhere_to_be_found\n")
    reports = tmp_path / "reports"
    files = earlier(reports)
    assert cli.main(["run", "--reports-dir", str(reports)]) == 2
    assert "hil run: pytest stopped before any test ran (exit 2" in capfd.readouterr().err
    assert_nothing_lost(files)


def test_a_completed_run_replaces_the_previous_results_as_a_set(suites, tmp_path, capfd):
    reports = tmp_path / "reports"
    earlier(reports)
    assert cli.main(["run", "--reports-dir", str(reports)]) == 1  # test_fails failed
    out = capfd.readouterr().out
    assert "hil run: 3 test result(s); reports in" in out
    # The earlier run's stats, device records and engine logs went with its results.
    assert visible(reports) == ["allure-report", "allure-results", "junit.xml", "stacks",
                                "summary.md", "timing.json"]
    assert not (reports / "allure-results" / "old-result.json").exists()
    assert len(list((reports / "allure-results").glob("*-result.json"))) == 3
    assert b"earlier" not in (reports / "junit.xml").read_bytes()
    assert (reports / "summary.md").read_text().startswith("# vllm-hil run")
    assert (reports / "allure-report" / "index.html").is_file()  # hil report's, untouched


def _hil_run(reports: Path, suites: Path, *args: str) -> subprocess.Popen[str]:
    code = ("import sys; from pathlib import Path; from harness import cli;"
            f" cli.RUN_SUITES = Path({str(suites)!r}); sys.exit(cli.main(sys.argv[1:]))")
    env = dict(os.environ, HIL_TEST_WAIT="1", PYTHONPATH=str(REPO_ROOT))
    return subprocess.Popen([sys.executable, "-c", code, "run", "--reports-dir", str(reports),
                             *args], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait_for_results(reports: Path, proc: subprocess.Popen[str], n: int) -> None:
    deadline = time.monotonic() + 120
    while len(list(reports.glob(".run-*/allure-results/*-result.json"))) < n:
        assert proc.poll() is None and time.monotonic() < deadline, "the run never got going"
        time.sleep(0.1)
    time.sleep(0.5)  # into test_waits


@pytest.mark.parametrize("sig, code, name", [(signal.SIGTERM, 143, "SIGTERM"),
                                             (signal.SIGINT, 130, "SIGINT (Ctrl-C)")],
                         ids=["SIGTERM", "SIGINT"])
def test_a_signal_keeps_what_the_run_recorded_and_the_previous_results(suites, tmp_path, sig,
                                                                       code, name):
    reports = tmp_path / "reports"
    files = earlier(reports)
    proc = _hil_run(reports, suites, "-k", "passes or waits")
    _wait_for_results(reports, proc, 1)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, out + err
    assert "Traceback" not in out + err
    assert_nothing_lost(files)
    kept = [p for p in reports.iterdir() if p.name.startswith("interrupted-")]
    assert len(kept) == 1 and not list(reports.glob(".run-*"))
    folder = kept[0]
    assert f"hil run: stopped by {name} after 2 test result(s); the partial results are kept in" \
           f" {folder} (summary.md marked INTERRUPTED); make their report with" \
           f" `hil report --reports-dir {folder}`" in err
    summary = (folder / "summary.md").read_text()
    assert summary.startswith(f"**INTERRUPTED**: stopped by {name} after 2 test result(s)")
    props = (folder / "allure-results" / "environment.properties").read_text()
    assert f"run.interrupted=stopped by {name}" in props
    assert (folder / "junit.xml").is_file()  # pytest ended its session
    # No pytest of this run is left running.
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(folder) not in ps and str(suites) not in ps


def test_a_second_run_on_the_same_reports_folder_is_refused(suites, tmp_path, capfd):
    reports = tmp_path / "reports"
    files = earlier(reports)
    with reports_lock(reports, "hil nightly --shard 1/2"):
        assert cli.main(["run", "--reports-dir", str(reports)]) == 2
        assert cli.main(["report", "--reports-dir", str(reports)]) == 2
    err = capfd.readouterr().err
    assert f"hil run: {reports} is in use by pid {os.getpid()} on " in err
    assert "(`hil nightly --shard 1/2`, started 20" in err
    assert "wait for it to finish or pass another --reports-dir" in err
    assert f"hil report: {reports} is in use by pid {os.getpid()}" in err
    assert_nothing_lost(files)
    assert not (reports / HOLDER_FILE).exists()  # released


def test_a_stale_holder_does_not_block(suites, tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    (reports / HOLDER_FILE).write_text(f'{{"pid": {dead}, "host": "h", "command": "hil run"}}')
    assert cli.main(["run", "--reports-dir", str(reports), "-k", "passes"]) == 0


def test_a_run_killed_outright_is_kept_by_the_next_one(suites, tmp_path, capfd):
    reports = tmp_path / "reports"
    killed = reports / ".run-20260101-000000-1" / "allure-results"
    killed.mkdir(parents=True)
    (killed / "x-result.json").write_text('{"uuid": "x", "name": "x"}')
    (reports / ".run-20260101-000000-2").mkdir()  # refused before a result: removed
    assert cli.main(["run", "--reports-dir", str(reports), "-k", "passes"]) == 0
    err = capfd.readouterr().err
    assert "hil run: an earlier run was killed: its partial results are kept in" in err
    kept = [p for p in reports.iterdir() if p.name.startswith("interrupted-")]
    assert len(kept) == 1 and (kept[0] / "allure-results" / "x-result.json").is_file()
    assert not list(reports.glob(".run-*"))


@pytest.mark.parametrize("err, hint", [
    (errno.ENOSPC, "free some space"), (errno.EROFS, "the file system is read-only"),
    (errno.EACCES, "check the folder's owner and permissions")])
def test_a_write_error_is_named_with_its_meaning(err, hint):
    e = OSError(err, os.strerror(err), "/r/summary.md")
    assert os_problem(e, "write the results") == (
        f"cannot write the results: /r/summary.md: {os.strerror(err)} ({hint})")


def test_a_full_disk_keeps_the_previous_results(suites, tmp_path, capfd, monkeypatch):
    err = errno.ENOSPC
    reports = tmp_path / "reports"
    files = earlier(reports)

    def fail(staging: Path, reports: Path) -> None:
        raise OSError(err, os.strerror(err), str(reports / "summary.md"))

    monkeypatch.setattr(staged_run, "publish", fail)
    assert cli.main(["run", "--reports-dir", str(reports), "-k", "passes"]) == 2
    text = capfd.readouterr().err
    assert (f"hil run: cannot write the results: {reports / 'summary.md'}: {os.strerror(err)}"
            in text)
    assert "Traceback" not in text
    assert "this run's results are kept in" in text
    assert_nothing_lost(files)
    assert len([p for p in reports.iterdir() if p.name.startswith("incomplete-")]) == 1


def test_an_unwritable_reports_folder_is_named(tmp_path, capfd, monkeypatch):
    reports = tmp_path / "reports"
    real_open = os.open

    def read_only(path, *a, **k):
        if str(path).startswith(str(reports)):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, *a, **k)

    monkeypatch.setattr(os, "open", read_only)
    assert cli.main(["run", "--reports-dir", str(reports)]) == 2
    err = capfd.readouterr().err
    assert (f"hil run: cannot write the results: {reports / '.hil-lock'}: Read-only file system"
            " (the file system is read-only); the previous results in") in err
