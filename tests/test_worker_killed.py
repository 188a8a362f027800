"""A pytest worker killed mid-test: its result is recorded, and its device lease is freed
for the other worker, which then finishes."""

import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from tests.suite_runner import ROOT

pytestmark = pytest.mark.e2e  # runs a child pytest with two workers and kills one

TEST_FILE = '''
import os

import pytest


@pytest.mark.hil_targets("spyre-eager-cb")
def test_worker_dies_holding_the_card(target_variant):
    assert target_variant.device == "card0"
    os._exit(9)


@pytest.mark.hil_targets("spyre-eager-cb")
def test_other_worker_gets_the_card(target_variant):
    assert target_variant.device == "card0"
'''


def test_killed_worker_loses_no_result_and_frees_its_lease(tmp_path):
    (tmp_path / "test_kill.py").write_text(TEST_FILE)
    inv = tmp_path / "one-card.toml"
    inv.write_text('[[device]]\nid = "card0"\nkind = "spyre"\nbackend = "eager"\n')
    junit = tmp_path / "junit.xml"
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
    died = cases["test_worker_dies_holding_the_card[spyre-eager-cb]"]
    other = cases["test_other_worker_gets_the_card[spyre-eager-cb]"]
    assert died.find("failure") is not None or died.find("error") is not None, out[-3000:]
    assert "crashed" in out  # xdist names the worker that died and the test it ran
    assert other.find("failure") is None and other.find("error") is None, out[-3000:]
