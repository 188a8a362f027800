"""Nothing a command wrote is lost to a later run, on the real stack: `hil explore` with a
budget too small for one example searches nothing (exit 2) and leaves the earlier
findings.md, which held a finding, byte for byte; its line says where both are."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.suite_runner import ROOT

pytestmark = pytest.mark.e2e  # hil explore opens its session (no example runs: seconds)

EARLIER = b"# hil explore: 1 finding\n\n## Finding abc123: [check kv_ledger.prefix_reuse]\n"


def test_explore_that_searched_nothing_keeps_the_earlier_findings(tmp_path):
    folder = tmp_path / "explore"
    folder.mkdir()
    (folder / "findings.md").write_bytes(EARLIER)
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "explore", "--reports-dir", str(tmp_path),
         "--budget", "0.000001", "--target", "vllm-cpu"],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
        timeout=600)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (folder / "findings.md").read_bytes() == EARLIER
    (partial,) = folder.glob("explore-incomplete-*")
    (line,) = [ln for ln in proc.stderr.splitlines() if "nothing was searched" in ln]
    assert f"kept the earlier findings.md at {folder / 'findings.md'}" in line
    assert f"this run's partial output (no example ran) at {partial}" in line
    assert (partial / "findings.md").read_text().startswith("# hil explore: no findings")
