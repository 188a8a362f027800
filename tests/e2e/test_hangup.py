"""SIGHUP (a closed terminal, a dropped ssh session) to `hil run` on real engines: the run stops
as on SIGTERM. Exit 129 naming the signal, the partial results kept apart and marked
interrupted, the previous results kept, and no process of the run (its pytest, the fork
server, the engines) left running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from harness.engine import forkserver
from tests.bad_input import assert_nothing_lost, earlier_run
from tests.processes import alive
from tests.suite_runner import ROOT

pytestmark = pytest.mark.e2e  # starts vLLM engines on the CPU under `hil run`


def _lab_env() -> dict[str, str]:
    """The environment of a lab's `hil run`: this test session's shared fork parents (which
    outlive a run of it by design) are not its own; it starts its parents, which must stop."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for name in (forkserver.SHARE_ENV, forkserver.OWNER_ENV):
        env.pop(name, None)
    return env


def test_sighup_stops_hil_run_and_every_process_of_it(tmp_path):
    reports = tmp_path / "reports"
    files = earlier_run(reports)
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "run", "--reports-dir", str(reports),
         "--model", "tiny-llama", "--target", "vllm-cpu",
         "-k", "test_greedy_tokens_equal_reference and (single or pair)"],
        cwd=ROOT, env=_lab_env(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    seen: set[int] = set()
    deadline = time.monotonic() + 600
    # Past the first result, with the run's engines up: every process of the run is seen.
    while not list(reports.glob(".run-*/allure-results/*-result.json")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        seen |= {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
        time.sleep(0.2)
    seen |= {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
    proc.send_signal(signal.SIGHUP)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 129, out[-3000:] + err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert "hil run: stopped by SIGHUP after " in err, err[-3000:]
    kept = [p for p in reports.iterdir() if p.name.startswith("interrupted-")]
    assert len(kept) == 1 and not list(reports.glob(".run-*")), sorted(reports.iterdir())
    assert (kept[0] / "summary.md").read_text().startswith("**INTERRUPTED**: stopped by SIGHUP")
    assert "run.interrupted=stopped by SIGHUP" in \
        (kept[0] / "allure-results" / "environment.properties").read_text()
    assert_nothing_lost(files)
    assert len(seen) >= 2, seen  # the pytest child and at least one engine-side process
    time.sleep(2)  # the engines' own exits (they die with pytest) settle
    assert not alive(seen), alive(seen)
