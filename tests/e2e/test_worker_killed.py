"""A pytest worker killed mid-test: its result is recorded, and its device lease is freed
for the other worker, which then runs and passes on that device after the kill.

The dying test writes a marker while it holds the only card, then exits. The other test
waits for that marker before it asks for the card, so it can only pass by getting the
lease the dead worker held; a lease never freed would make it skip (after --lease-wait),
which fails this test.
"""

import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import pytest

from tests.suite_runner import ROOT

pytestmark = pytest.mark.e2e  # runs a child pytest with two workers and kills one

TEST_FILE = '''
import os
import time
from pathlib import Path

import pytest

MARKS = Path({marks!r})


@pytest.fixture
def after_the_kill():
    """Waits until the other test holds the card and is about to die."""
    deadline = time.time() + 300
    while not (MARKS / "killed").exists():
        assert time.time() < deadline, "the dying test never held the card"
        time.sleep(0.2)


@pytest.mark.hil_targets("spyre-eager-cp")
def test_worker_dies_holding_the_card(target_variant):
    assert target_variant.device == "card0"
    (MARKS / "killed").write_text(repr(time.time()))
    os._exit(9)


@pytest.mark.hil_targets("spyre-eager-cp")
def test_other_worker_gets_the_card(after_the_kill, target_variant):
    assert target_variant.device == "card0"
    (MARKS / "passed").write_text(repr(time.time()))
'''


def test_killed_worker_loses_no_result_and_frees_its_lease(tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    (tmp_path / "test_kill.py").write_text(TEST_FILE.format(marks=str(marks)))
    inv = tmp_path / "one-card.toml"
    inv.write_text('[[device]]\nid = "card0"\nkind = "spyre"\nbackend = "eager"\n')
    junit = tmp_path / "junit.xml"
    started = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(tmp_path / "test_kill.py"), "-n", "2",
         "-p", "harness.plugin.hooks", "-p", "harness.plugin.fixtures", "-p", "no:cacheprovider",
         "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"), "--model", "tiny-llama",
         "--inventory", str(inv), "--lease-dir", str(tmp_path / "leases"), "--lease-wait", "120",
         f"--hil-reports-dir={tmp_path / 'reports'}", f"--junitxml={junit}", "-q"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    out = proc.stdout + proc.stderr
    cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}
    assert len(cases) == 2, out[-3000:]
    died = cases["test_worker_dies_holding_the_card[spyre-eager-cp]"]
    other = cases["test_other_worker_gets_the_card[spyre-eager-cp]"]
    assert died.find("failure") is not None or died.find("error") is not None, out[-3000:]
    assert "crashed" in out  # xdist names the worker that died and the test it ran
    for outcome in ("failure", "error", "skipped"):  # it ran and passed: not skipped
        assert other.find(outcome) is None, (outcome, out[-3000:])
    # The card was held by the dying test first, and the other test passed after the kill.
    killed, passed = (float((marks / m).read_text()) for m in ("killed", "passed"))
    assert started < killed < passed, (started, killed, passed)
