"""What a run leaves in its results folder: a killed run keeps the results it wrote and the
environment, a run stopped by SIGTERM ends its session as after a Ctrl-C, and a direct pytest
run given --hil-clean-results replaces the previous results once its arguments are accepted
(`hil run` writes into a fresh folder instead: tests/unit/report/test_results_kept.py)."""

import os
import signal
import subprocess
import sys
import time

from harness.core.paths import REPO_ROOT
from tests.bad_input import earlier_run, write
from tests.suite_runner import CHECKOUT_PLUGINS

ROOT = REPO_ROOT

KILLED_SUITE = """
import time

def test_first_finishes():
    pass

def test_second_is_killed():
    time.sleep(300)
"""


def test_a_killed_run_leaves_its_results_with_the_environment(tmp_path):
    from harness.report.results import load_results
    from harness.report.summary import write_summary

    suite = write(tmp_path, "test_killed.py", KILLED_SUITE)
    results = tmp_path / "allure-results"
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
           *CHECKOUT_PLUGINS, f"--alluredir={results}",
           f"--hil-reports-dir={tmp_path / 'reports'}", str(suite)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not list(results.glob("*-result.json")):
            assert proc.poll() is None and time.monotonic() < deadline, "the run never got going"
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGKILL)  # a CI timeout: no sessionfinish
        proc.wait()
    folder = load_results(results)
    assert "environment.properties" in folder.config
    props = folder.config["environment.properties"].read_text()
    assert "stack.default=" in props and "run.targets=all" in props
    assert [t["name"] for t in folder.results.values()] == ["first finishes"]
    assert "passed" in write_summary(results, tmp_path / "summary.md").lower()


def test_accepted_arguments_clean_the_previous_results_once(tmp_path):
    """The other side of the rows above: a direct pytest run whose arguments are accepted
    replaces the previous results when given --hil-clean-results."""
    suite = write(tmp_path, "test_quick.py", "def test_quick():\n    pass\n")
    reports = tmp_path / "reports"
    earlier = earlier_run(reports)
    results = reports / "allure-results"
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
           *CHECKOUT_PLUGINS, f"--alluredir={results}", "--hil-clean-results",
           f"--hil-reports-dir={reports}", str(suite)]
    run = subprocess.run(cmd, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert not (results / "old-result.json").exists()
    assert not (reports / "stats").exists() and not (reports / "devices").exists()
    assert len(list(results.glob("*-result.json"))) == 1
    assert (results / "environment.properties").read_bytes() != earlier[results / "environment.properties"]
    assert (reports / "summary.md").read_bytes() == b"# earlier summary\n"  # hil run rewrites it


def test_sigterm_ends_a_direct_run_as_a_ctrl_c_does(tmp_path):
    """The session finishes: junit and the results of the tests that ran are written, pytest
    exits 2 (interrupted), no INTERNALERROR."""
    suite = write(tmp_path, "test_killed.py", KILLED_SUITE)
    results = tmp_path / "allure-results"
    junit = tmp_path / "junit.xml"
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
           *CHECKOUT_PLUGINS, f"--alluredir={results}", f"--junitxml={junit}",
           f"--hil-reports-dir={tmp_path / 'reports'}", str(suite)]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not list(results.glob("*-result.json")):
        assert proc.poll() is None and time.monotonic() < deadline, "the run never got going"
        time.sleep(0.1)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2, out
    assert "KeyboardInterrupt" in out and "INTERNALERROR" not in out
    assert "1 passed" in out and junit.is_file()


def test_the_runs_warnings_reach_its_summary(tmp_path):
    """A quarantine entry that matches no test is said in the terminal summary and in
    summary.md's "Warnings", once, with xdist too (each worker records it in its stats)."""
    from harness.report.summary import write_summary

    suite = write(tmp_path, "test_quick.py",
                  "def test_quick(hil):\n    pass\n\ndef test_other(hil):\n    pass\n")
    write(tmp_path, "q.toml", '[[known]]\ntest = "test_quick.py::test_gone"\nreason = "r"\n'
                              'issue = "I-1"\n')
    reports = tmp_path / "reports"
    results = reports / "allure-results"
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "2",
           *CHECKOUT_PLUGINS, f"--alluredir={results}", f"--hil-reports-dir={reports}",
           f"--quarantine={tmp_path / 'q.toml'}", str(suite)]
    run = subprocess.run(cmd, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                         capture_output=True, text=True, timeout=300)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    said = "known #1 ('test_quick.py::test_gone') matches no collected test"
    assert f"WARNING: quarantine: {tmp_path / 'q.toml'}: {said}" in out, out
    assert len(list((reports / "stats").glob("*.json"))) == 2
    text = write_summary(results, reports / "summary.md")
    section = text.split("## Warnings", 1)[1]
    assert section.count(said) == 1, text
