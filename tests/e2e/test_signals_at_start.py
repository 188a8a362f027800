"""SIGINT, SIGTERM or SIGHUP sent to `hil run` at any moment of its start: 0.2 s, 1 s and 3 s
after it started (hil importing its modules), as soon as its child pytest exists (starting,
importing the plugin: where a forwarded SIGINT printed 150-215 lines of the child's
traceback) and during collection. Each ends with exit 128 + the signal, no traceback (of hil or
of its child), exactly one line saying what was stopped and kept, the earlier results byte
for byte, and no process of the run left. The run selects nothing and its collection waits
(tests/e2e/slow_collection.py): no engine starts, so each case costs seconds.

The moments count from the end of the interpreter's own start-up (its site module, marked
by a sitecustomize of the test's): before it no code of hil has run, Python's start-up
itself takes a signal (a traceback of site, when one comes while a .pth file imports), and
hil can do nothing about it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.bad_input import assert_nothing_lost, earlier_run
from tests.e2e.slow_collection import MARKER_ENV
from tests.processes import alive
from tests.suite_runner import ROOT

pytestmark = pytest.mark.e2e  # a real hil run and its child pytest (no engine)

STOP_LINE = re.compile(r"^hil( run)?: (stopped|interrupted) by ")


def _of_this_run(reports) -> list[str]:
    """Any process whose command line names this run's reports folder (the child pytest)."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and \
                    any(str(reports) in a for a in p.info["cmdline"] or []):
                found.append(f"{p.info['pid']} {' '.join(p.info['cmdline'])[:200]}")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


# Each signal at least once, each moment once: the cases cost seconds each, in CI.
@pytest.mark.parametrize("sig, moment", [
    (signal.SIGINT, 0.2), (signal.SIGTERM, 1.0), (signal.SIGHUP, 3.0),
    (signal.SIGTERM, "child"), (signal.SIGINT, "collection"),
])
def test_a_stop_at_the_start_of_hil_run_says_one_line_and_leaves_nothing(tmp_path, sig, moment):
    reports = tmp_path / "reports"
    files = earlier_run(reports)
    marker = tmp_path / "collecting"
    started = tmp_path / "started"  # written when hil's interpreter has started
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os\nfrom pathlib import Path\n"
        f"if os.getppid() == {os.getpid()}:\n    Path({str(started)!r}).touch()\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]),
               **{MARKER_ENV: str(marker)})
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "run", "--reports-dir", str(reports),
         "-p", "tests.e2e.slow_collection", "--target", "vllm-cpu", "-k", "zzz_no_such_test"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not started.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.005)
    start = time.monotonic()
    seen: set[int] = set()
    while True:
        assert proc.poll() is None, proc.communicate()
        seen |= {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
        if moment == "child":  # its pytest importing pytest and the harness's plugin
            if seen:
                time.sleep(1.0)
                break
            assert time.monotonic() - start < 300, "no child pytest started"
        elif moment == "collection":
            if marker.exists():
                break
            assert time.monotonic() - start < 300, "collection never began"
        elif time.monotonic() - start >= moment:
            break
        time.sleep(0.02)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    said = f"{out[-3000:]}\n{err[-3000:]}"
    assert proc.returncode == 128 + sig, said
    assert "Traceback" not in out + err, said
    stops = [ln for ln in (out + err).splitlines() if STOP_LINE.match(ln)]
    assert len(stops) == 1, said
    assert "kept" in stops[0] or "nothing was changed" in stops[0], stops
    assert_nothing_lost(files)
    assert not list(reports.glob(".run-*")), sorted(reports.iterdir())
    time.sleep(1)  # a child's own exit settles
    assert not alive(seen), alive(seen)
    assert not _of_this_run(reports), _of_this_run(reports)
