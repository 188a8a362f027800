"""The emulated card host end to end (tools/card-host/run.sh): every card suite runs with no skip,
one live engine per card, each configuration started once per card; and the checks still bite
there: one injected fault per suite fails, and an engine on another card fails the verification.

The card image is built on the spyre-1.10 stack (vllm-spyre 1.x): run.sh's image check imports
vllm_spyre, and its selection covers the sb, cb and cp card modes, of which sendnn-inference 2.x
(the default stack) keeps only cp. Its image lives in its own folder, apart from one built on
another stack."""

from __future__ import annotations

import json
import os
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.core.paths import REPO_ROOT
from harness.engine.device_ledger import ledger_problems
from harness.stacks.spec import stack_python
from tests.suite_runner import SPYRE_1X_STACK, needs_spyre_1x

ROOT = REPO_ROOT
RUN_SH = ROOT / "tools" / "card-host" / "run.sh"

pytestmark = [pytest.mark.e2e, pytest.mark.card_host, pytest.mark.timeout(1500), needs_spyre_1x]
# The card image's preinstalled stack (HIL_CARD_HOST_BASE_PYTHON) and its own work folder.
CARD_IMAGE_ENV = {
    "HIL_CARD_HOST_BASE_PYTHON": str(stack_python(SPYRE_1X_STACK)),
    "HIL_CARD_HOST_DIR": str(ROOT / ".hil-cache" / f"card-host-{SPYRE_1X_STACK}"),
}


def card_host(run_dir: Path, *args: str) -> tuple[int, str, dict[str, tuple[str, str]], list[dict]]:
    """Run the card host; (rc, output, test name -> (outcome, message), card ledger events)."""
    env = {**os.environ, **CARD_IMAGE_ENV, "HIL_CARD_HOST_RUN_DIR": str(run_dir),
           "HIL_CARD_HOST_NO_DEVICES_CHECK": "1"}
    proc = subprocess.run(["bash", str(RUN_SH), *args], capture_output=True, text=True, env=env,
                          timeout=1400)
    results: dict[str, tuple[str, str]] = {}
    junit = run_dir / "reports" / "junit.xml"
    if junit.exists():
        for case in ET.parse(junit).getroot().iter("testcase"):
            outcome, message = "passed", ""
            for tag in ("failure", "error", "skipped"):
                el = case.find(tag)
                if el is not None:
                    outcome, message = tag, (el.get("message") or "") + "\n" + (el.text or "")
            results[case.get("name", "")] = (outcome, message)
    events: list[dict] = []
    for f in sorted((run_dir / "reports" / "stats").glob("*.json")):
        events += json.loads(f.read_text()).get("cards", [])
    return proc.returncode, proc.stdout + proc.stderr, results, events


def test_every_card_suite_runs_on_two_cards_one_engine_each(tmp_path: Path) -> None:
    rc, out, results, events = card_host(tmp_path / "run")
    assert rc == 0, out[-4000:]
    outcomes = {o for o, _ in results.values()}
    assert outcomes == {"passed"}, {k: v for k, v in results.items() if v[0] != "passed"}
    suites = {"token_equality", "no_recompute", "block_freeing", "capacity"}
    assert len(results) == 15, sorted(results)
    assert {s for s in suites if (tmp_path / "run" / "suites" / f"test_{s}.py").exists()} == suites
    assert ledger_problems(events) == []  # one live engine per card, each configuration once
    assert {e["device"] for e in events} == {"card0", "card1"}
    assert "card card0:" in out and "card card1:" in out


def _one_failure(results: dict[str, tuple[str, str]], out: str) -> str:
    failed = [m for o, m in results.values() if o in ("failure", "error")]
    assert len(failed) == 1, out[-4000:]
    return failed[0]


@pytest.mark.parametrize("selection, fault, message, category", [
    ("token_equality and cb-pair", "perturb-logit:position=3", "not a near-tie", "token mismatch"),
    ("back-to-idle and cb", "forget-free", "kv invariant conservation broken at step", "block leak"),
    ("no_recompute and cb-64-2", "forget-free", "kv invariant conservation broken at step",
     "block leak"),
    ("capacity and refuses and cb", "crash-engine:when=start", "died with exit code",
     "engine crash / harness error"),
])
def test_a_fault_fails_each_suite_on_the_emulated_card(tmp_path: Path, selection: str, fault: str,
                                                       message: str, category: str) -> None:
    from harness.report.categories import classify

    rc, out, results, _ = card_host(tmp_path / "run", "-k", selection, "--inject-fault", fault)
    assert rc == 1, out[-4000:]
    text = _one_failure(results, out)
    assert message in text
    assert classify("failed", text.split("\n")[0]) == category, text[:2000]


def test_an_engine_on_another_card_fails_the_verification(tmp_path: Path) -> None:
    # The fault points the runtime at card1 while the harness leased card0.
    rc, out, results, _ = card_host(
        tmp_path / "run", "-k", "token_equality and cb-pair",
        "--inject-fault", "open-other-card:address=0000:3c:00.0")
    assert rc == 1, out[-4000:]
    text = _one_failure(results, out)
    assert "is not the leased card's Spyre sendnn engine (wrong opened)" in text
    assert "opened: expected SEN:VFIO:0000:3b:00.0, seen SEN:VFIO:0000:3c:00.0" in text
