"""The emulated card host end to end (tools/card-host/run.sh): every card suite runs on every card
mode the image's plugin generation has, one live engine per card, each configuration started
once per card, and the modes it lacks skip naming the generation; and the checks still bite
there: one injected fault per suite fails, and an engine on another card fails the verification.

The card image is built on the default stack (sendnn-inference 2.x: cp and pc), as run.sh builds
it, and on the spyre-1.10 stack (vllm-spyre 1.x: sb, cb and cp), whose image lives in its own
folder (run.sh's image stamp does not cover the base stack). The faults and the verification run
on the default stack's image, on cp."""

from __future__ import annotations

import json
import os
import re
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from fixtures.models import DEFAULT_CACHE_DIR
from harness.core.paths import REPO_ROOT
from harness.engine.device_ledger import ledger_problems
from harness.stacks.spec import stack_python
from tests.suite_runner import SPYRE_1X_STACK, needs_spyre_1x

ROOT = REPO_ROOT
RUN_SH = ROOT / "tools" / "card-host" / "run.sh"

pytestmark = [pytest.mark.e2e, pytest.mark.card_host, pytest.mark.timeout(1500)]

# base stack -> (its plugin generation, the card modes it runs, tests run.sh's selection passes
# (its `capacity` keyword takes in the block-admission suite: the modes that hold back on
# blocks), tests it skips as of a shape a card does not compile: vllm-spyre 1.x's reservation
# edge, written for a batch of two)
BASES = {
    "default": ("sendnn-inference 2.x", ("cp", "pc"), 14, 0),
    SPYRE_1X_STACK: ("vllm-spyre 1.x", ("sb", "cb", "cp"), 15, 2),
}
NOT_COMPILED = "a Spyre card does not compile this engine"


def image_env(base: str) -> dict[str, str]:
    """The card image's preinstalled stack and work folder: run.sh's own for the default stack."""
    if base == "default":
        return {}
    return {"HIL_CARD_HOST_BASE_PYTHON": str(stack_python(base)),
            "HIL_CARD_HOST_DIR": str(ROOT / ".hil-cache" / f"card-host-{base}")}


def card_host(run_dir: Path, *args: str, base: str = "default",
              host_env: dict[str, str] | None = None
              ) -> tuple[int, str, dict[str, tuple[str, str]], list[dict]]:
    """Run the card host on ``base``'s image; (rc, output, test name -> (outcome, message),
    card ledger events)."""
    env = {**os.environ, **image_env(base), **(host_env or {}), "HIL_CARD_HOST_RUN_DIR": str(run_dir),
           # The checkout's cache is content-keyed: its models and references serve the host's
           # runs as a lab's shared cache would (no second build of the same tiny model).
           "HIL_CARD_HOST_CACHE_DIR": os.environ.get("HIL_CACHE_DIR", str(DEFAULT_CACHE_DIR)),
           "HIL_CARD_HOST_NO_DEVICES_CHECK": "1",
           "HIL_NO_TRIAGE": "1"}  # these runs prove checks fail; triage is proved elsewhere
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


@pytest.mark.parametrize("base", ["default", pytest.param(SPYRE_1X_STACK, marks=needs_spyre_1x)])
def test_every_card_suite_runs_on_two_cards_one_engine_each(tmp_path: Path, base: str) -> None:
    generation, modes, passing, not_compiled = BASES[base]
    rc, out, results, events = card_host(tmp_path / "run", base=base)
    assert rc == 0, out[-4000:]
    for name, (outcome, message) in results.items():
        mode = re.search(r"spyre-sendnn-(\w+)", name)
        assert mode, name
        # A mode the image's plugin generation lacks is not collected on the host stack.
        assert mode.group(1) in modes, (name, generation)
        # Every engine started is of a shape a card compiles (the emulated runtime refuses
        # others at start); a test written for another skips saying so, and no test else.
        assert outcome == "passed" or (outcome == "skipped" and NOT_COMPILED in message), (
            name, message[:2000])
    assert sum(o == "passed" for o, _ in results.values()) == passing, sorted(results)
    assert sum(o == "skipped" for o, _ in results.values()) == not_compiled, sorted(results)
    suites = {"token_equality", "no_recompute", "block_freeing", "capacity"}
    ran = {c.get("classname", "").rpartition(".")[2].removeprefix("test_") for c in
           ET.parse(tmp_path / "run" / "reports" / "junit.xml").getroot().iter("testcase")}
    assert suites <= ran, ran  # the image's installed suites (hil suites), every one
    # Passed on the emulated runtime, which the run allowed: each result says so.
    allure = [json.loads(f.read_text())
              for f in (tmp_path / "run" / "reports" / "allure-results").glob("*-result.json")]
    tags = [{lb["value"] for lb in r.get("labels", []) if lb["name"] == "tag"}
            for r in allure if r.get("status") == "passed"]
    assert len(tags) == passing and all("emulated" in t for t in tags), tags
    assert ledger_problems(events) == []  # one live engine per card, each configuration once
    assert {e["device"] for e in events} == {"card0", "card1"}
    assert "card card0:" in out and "card card1:" in out


def _one_failure(results: dict[str, tuple[str, str]], out: str) -> str:
    failed = [m for o, m in results.values() if o in ("failure", "error")]
    assert len(failed) == 1, out[-4000:]
    return failed[0]


@pytest.mark.parametrize("selection, fault, message, category", [
    ("token_equality and cp-pair", "perturb-logit:position=3", "not a near-tie", "token mismatch"),
    ("back-to-idle and cp", "forget-free", "kv invariant conservation broken at step", "block leak"),
    ("no_recompute and cp-64-4", "forget-free", "kv invariant conservation broken at step",
     "block leak"),
    ("capacity and refuses and cp", "crash-engine:when=start", "died with exit code",
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


FOUR_CARDS = {"HIL_CARD_HOST_CARDS": "4", "HIL_CARD_HOST_GROUP": "4"}


def test_an_engine_on_another_card_or_the_simulator_fails_the_verification(tmp_path: Path) -> None:
    # One run on a 4-card host whose inventory declares group0 (all four cards; one worker: a
    # one-card engine leases card0), three engines: on cp the runtime of rank 0 is pointed at
    # card3, which the harness did not lease for it; on pc it opens the simulator
    # (FLEX_COMPUTE=SENULATOR); the cp TP 4 engine on group0 gets the same variables and rank 1
    # pointed at rank 0's card.
    rc, out, results, _ = card_host(
        tmp_path / "run", "-k", "token_equality and (cp-pair or pc-pair) or "
        "test_full_batch_in_geometry and tiny-llama and cp-tp4", "--geometry", "small,tp4",
        "--inject-fault", "open-other-card:address=0000:3e:00.0,variant=spyre-sendnn-cp",
        "--inject-fault", "open-other-card:address=0000:3b:00.0,of_rank=1,variant=spyre-sendnn-cp",
        "--inject-fault", "open-simulator:variant=spyre-sendnn-pc", host_env=FOUR_CARDS)
    assert rc == 1, out[-4000:]
    failed = {name: m for name, (o, m) in results.items() if o in ("failure", "error")}
    assert len(failed) == 3, out[-4000:]
    group = failed.pop("test_full_batch_in_geometry[tiny-llama-spyre-sendnn-cp-tp4]")
    assert "is not the leased card group's Spyre sendnn engine (wrong opened)" in group, group[:3000]
    assert "rank 0's runtime would open AIU_WORLD_RANK_0=0000:3e:00.0, not its card 0000:3b:00.0" in group
    assert "rank 1 opened SEN:VFIO:0000:3b:00.0, expected SEN:VFIO:0000:3c:00.0" in group
    other = next(m for n, m in failed.items() if "spyre-sendnn-cp" in n)
    assert "is not the leased card's Spyre sendnn engine (wrong opened)" in other
    assert re.search(r"opened: expected SEN:VFIO:0000:3[bcd]:00\.0, seen SEN:VFIO:0000:3e:00\.0", other)
    simulator = next(m for n, m in failed.items() if "spyre-sendnn-pc" in n)
    assert "(wrong FLEX_COMPUTE, opened)" in simulator, simulator[:2000]
    assert "FLEX_COMPUTE: expected SENTIENT, seen SENULATOR" in simulator
    assert "seen SENULATOR" in simulator.split("opened: expected", 1)[1]
