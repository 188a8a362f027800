"""hil explore on real engines: with a fault injected (``forget-free``: vLLM's block pool, under
sendnn-inference 2.x too, drops a block at a free) it finds the fault, shrinks the example to
one request of one token in the simplest geometry, confirms it on three fresh engines (the
same check, the same cause each time), and writes a regression test that fails as written in
findings.md; without a fault a short budget finds nothing and exits 0.

Each search runs in a cache of its own (the tiny models linked in), so the example database
starts empty and what is measured is a search from nothing. The search without a fault runs in
the background while the other test runs (most of each is an engine's first start).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.core.paths import REPO_ROOT

# Engines (about three minutes); every test starts the search without a fault, in the background.
pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("clean_search")]

TARGET = "spyre-eager-cp"
MODELS = Path(os.environ.get("HIL_CACHE_DIR", "").strip() or REPO_ROOT / ".hil-cache") / "models"


def hil_explore(tmp_path: Path, *args: str) -> subprocess.Popen:
    """``hil explore`` on TARGET with tiny-llama, started, its reports and cache in
    ``tmp_path``."""
    cache = tmp_path / "cache"
    cache.mkdir(exist_ok=True)
    MODELS.mkdir(parents=True, exist_ok=True)
    if not (cache / "models").exists():
        (cache / "models").symlink_to(MODELS, target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if k not in ("HIL_FAULTS", "HIL_TARGET")}
    cmd = [sys.executable, "-m", "harness.cli", "explore", "--target", TARGET, "--model",
           "tiny-llama", "--reports-dir", str(tmp_path / "reports"), "--cache-dir", str(cache),
           *args]
    with open(tmp_path / "explore.log", "w") as log:  # a file: a pipe nobody reads would fill
        search = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                  text=True, env=env)
    search.log = tmp_path / "explore.log"  # type: ignore[attr-defined]
    return search


def finish(search: subprocess.Popen) -> tuple[int, str]:
    """The exit code and output of a started search."""
    search.wait(timeout=600)
    return search.returncode, search.log.read_text()  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def clean_search(tmp_path_factory: pytest.TempPathFactory):
    """A short search without a fault, started with the module's first test."""
    folder = tmp_path_factory.mktemp("clean")
    search = hil_explore(folder, "--budget", "20", "--seed", "0")
    yield folder, search
    if search.poll() is None:
        search.kill()
        search.wait()


def test_an_injected_fault_is_found_shrunk_and_kept_as_a_failing_regression_test(tmp_path):
    code, output = finish(hil_explore(tmp_path, "--budget", "120", "--seed", "0",
                                      "--shrink-budget", "60", "--inject-fault", "forget-free"))
    assert code == 1, output[-3000:]
    folder = tmp_path / "reports" / "explore"
    findings = (folder / "findings.md").read_text()
    assert findings.startswith("# hil explore: 1 finding\n"), findings
    assert "[check kv_ledger.conservation] kv invariant conservation broken at step" in findings
    assert "blocks are neither free, owned nor pad" in findings
    # shrunk: one request of one token, max_tokens 1, in the simplest geometry
    assert "| r0 | 1 | - | 1 | 0 | - |" in findings and "| r1 |" not in findings, findings
    assert "Geometry: context 128, batch 1, chunk 128, pool full-batch" in findings
    # confirmed before it was reported: three replays on fresh engines failed the same way
    assert ("Confirmed: failed the same way (the same check, the same cause) in 3 of 3 replays"
            " on fresh engines") in findings, findings
    assert findings.count("| failed the same way |") == 3, findings
    assert "Checks that held on this example: " in findings, findings
    for n in (1, 2, 3):
        assert f"hil explore: replay {n} of 3 on a fresh engine: failed the same way" in output
    assert "hil explore: checks that held on its example: " in output, output[-3000:]
    (test,) = folder.glob("test_finding_*.py")
    command = findings.split("```bash\n", 1)[1].split("\n```", 1)[0]
    assert str(test) in command and "--inject-fault forget-free" in command
    # the regression test, as findings.md says to run it, fails on the same check
    replay = subprocess.run(["bash", "-c", f"{command} --no-triage -p no:cacheprovider"],
                            capture_output=True, text=True, timeout=600,
                            env={k: v for k, v in os.environ.items() if k != "HIL_FAULTS"})
    replayed = replay.stdout + replay.stderr
    assert replay.returncode == 1, replayed[-3000:]
    assert "1 failed" in replayed and "[check kv_ledger.conservation]" in replayed, replayed[-3000:]
    # the database kept the failing example: its geometry is listed for the next search
    assert (tmp_path / "cache" / "explore" / "cells.json").is_file()


def test_without_a_fault_a_short_search_finds_nothing(clean_search):
    tmp_path, search = clean_search
    code, output = finish(search)
    assert code == 0, output[-3000:]
    folder = tmp_path / "reports" / "explore"
    findings = (folder / "findings.md").read_text()
    assert findings.startswith("# hil explore: no findings\n"), findings
    assert "examples run: " in findings and not list(folder.glob("test_finding_*.py"))
