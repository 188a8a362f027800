"""Known failures' triages, recorded once and reused: a quarantined test's failure is triaged
on its first run and recorded, reused on the next with nothing changed (no engine runs, shown
as reused with its date), triaged again when an input of its verdict changes, and never
counted against --triage-max or --triage-budget, so a real regression later in the same
process is still triaged."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from harness.core import triage as r
from harness.core.config import EngineConfig
from harness.core.verdict import TOKEN_EQUALITY, Verdict, VerdictFailed
from harness.lab.quarantine import KnownFailure, apply_quarantine, quarantined_by
from harness.session.facade import HilSession, SessionOptions
from harness.triage import record, session_hook
from harness.triage.budget import RAN_OUT, TriageBudget
from harness.triage.plan import FailedRun
from harness.triage.record import TriageRecords, record_key
from harness.triage.runner import TriageRunner
from harness.triage.session_hook import TriageDesk, with_triage
from tests.unit.triage.test_runner import FACTS, POLICIES, SCENARIO, FakeDriver, FakePool, trace

KNOWN = "suites/test_block_freeing.py::test_blocks_return_to_the_pool[x-aborted]"
REAL = "suites/test_token_equality.py::test_greedy[x-pair]"
ENTRY = KnownFailure("suites/test_block_freeing.py::test_blocks_return_to_the_pool[*-aborted]",
                     "the plugin keeps an aborted request's block promise", "ISSUE-1",
                     stacks=("default",))
CFG = EngineConfig("vllm-cpu", "/m", 256, 4)
BAD = Verdict.failed(TOKEN_EQUALITY, "token mismatch: request 'r0' at position 2")


def always(cfg, scenario, cycled) -> bool:
    """The fake engine fails request r0 every time: a deterministic failure."""
    return "r0" in {q.request_id for q in scenario.requests}


@pytest.fixture(autouse=True)
def fixed_facts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan's facts of the engine, as in the runner's tests (no stack is asked)."""
    monkeypatch.setattr(session_hook, "facts_of", lambda cfg: FACTS)


def desk(cache, max_tests: int = 3, seconds: float = 600.0, entry: KnownFailure = ENTRY,
         fails=always) -> TriageDesk:
    """A session's triage desk (one pytest process) over the harness cache ``cache``, whose
    quarantine marks KNOWN known by ``entry``."""
    runner = TriageRunner(FakePool(), FakeDriver(fails), POLICIES,
                          TriageBudget(max_tests, seconds))
    return TriageDesk(runner, TriageRecords.in_cache(cache),
                      known_failure=lambda nodeid: entry if nodeid == KNOWN else None)


def fail(d: TriageDesk, nodeid: str, cfg: EngineConfig = CFG) -> tuple[str | None,
                                                                       r.TriageResult | None]:
    """Test ``nodeid`` runs SCENARIO on ``cfg`` and its token equality fails, as
    ``HilSession.expect`` asks the desk: (why it is not triaged, the triage)."""
    d.begin_test(nodeid)
    failed = trace(cfg.label, {"r0"})
    d.ran(cfg, SCENARIO, "generate", None, failed)
    d.referenced(SCENARIO, trace("cpu-ref", set()))
    why = d.refused(BAD, failed)
    return why, (None if why else d.failed(nodeid, BAD, failed))


def engine_runs(d: TriageDesk) -> int:
    return len(d.runner.driver.calls)


def records_in(cache) -> list:
    return sorted((cache / "triage").rglob("*.json"))


def test_a_known_failure_is_triaged_once_then_reused_while_nothing_changed(tmp_path):
    first = desk(tmp_path)
    why, made = fail(first, KNOWN)
    assert why is None and made is not None and not made.reused
    assert made.key == r.DETERMINISTIC and engine_runs(first) > 0
    assert "known failure (quarantined): recorded for the next runs" in made.note
    (path,) = records_in(tmp_path)
    stored = json.loads(path.read_text())
    assert stored["slot"] == {"stack": "default", "test": KNOWN, "entry": {
        "test": ENTRY.test, "reason": ENTRY.reason, "issue": ENTRY.issue, "stacks": ["default"]}}
    assert stored["result"]["reused_from"] == "" and "known failure" not in stored["result"]["note"]

    second = desk(tmp_path)  # the next run: a new process, the same cache
    why, reused = fail(second, KNOWN)
    assert why is None and reused is not None and engine_runs(second) == 0
    assert reused.reused_from == stored["recorded_at"]
    assert (reused.key, reused.verdict, reused.runs) == (made.key, made.verdict, made.runs)
    assert reused.seconds < 1.0 and second.results == [reused]
    assert second.records.reused == 1
    text = with_triage(BAD, reused).details
    assert f"triage: {made.verdict}\n  (reused: triaged {reused.reused_from};" in text
    assert reused.cost().startswith(f"{reused.runs_made} runs, reused: triaged {reused.reused_from}")
    assert reused.cost() in reused.table()


@pytest.mark.parametrize("change", ["stack", "harness", "plan", "model", "engine", "reference"])
def test_a_known_failure_is_triaged_again_when_an_input_of_its_verdict_changed(
        tmp_path, monkeypatch, change):
    model = tmp_path / "model"
    model.mkdir()
    (model / "weights.bin").write_bytes(b"one")
    cfg = EngineConfig("vllm-cpu", str(model), 256, 4)
    cache = tmp_path / "cache"
    fail(desk(cache), KNOWN, cfg)
    real_harness = record.harness_digest()
    if change == "stack":  # another plugin version installed in the stack
        real = record.stack_fingerprint
        monkeypatch.setattr(record, "stack_fingerprint",
                            lambda name: {**real(name), "versions": {"sendnn-inference": "2.7"}})
    elif change == "harness":
        monkeypatch.setattr(record, "harness_digest",
                            lambda: {**real_harness, "engine": "another source"})
    elif change == "plan":
        monkeypatch.setattr(record, "PLAN_VERSION", record.PLAN_VERSION + 1)
    elif change == "model":
        (model / "weights.bin").write_bytes(b"retrained")
    elif change == "engine":
        cfg = cfg.with_(max_num_batched_tokens=64)
    else:  # the reference the token check judges against
        monkeypatch.setattr(session_hook.TriageDesk, "referenced",
                            lambda self, s, t: self._refs.__setitem__(s.name, trace("x", {"r1"})))
    again = desk(cache)
    _, result = fail(again, KNOWN, cfg)
    assert result is not None and not result.reused and engine_runs(again) > 0
    changed = {"stack": "previous_stack (versions), stack (versions)",
               "harness": "harness (engine)",
               "engine": "engine (max_num_batched_tokens)"}.get(change, change)
    assert f"no longer holds: its {changed} changed" in result.note
    assert len(records_in(cache)) == 1  # the stale record replaced, not kept beside


def test_another_quarantine_entry_or_stack_is_another_record(tmp_path):
    fail(desk(tmp_path), KNOWN)
    reworded = KnownFailure(ENTRY.test, "reworded", ENTRY.issue, stacks=ENTRY.stacks)
    again = desk(tmp_path, entry=reworded)
    _, result = fail(again, KNOWN)
    assert result is not None and not result.reused and engine_runs(again) > 0
    other = desk(tmp_path)
    _, result = fail(other, KNOWN, CFG.with_(stack="spyre-1.10"))
    assert result is not None and not result.reused
    assert len(records_in(tmp_path)) == 3


def test_a_known_failure_never_counts_against_the_budget(tmp_path):
    for run in ("fresh", "reused"):
        d = desk(tmp_path, max_tests=1)
        why, known = fail(d, KNOWN)
        assert why is None and known is not None and known.reused == (run == "reused")
        assert d.runner.budget.tests == 0 and d.runner.budget.spent == 0.0
        why, real = fail(d, REAL)  # a real regression later in the same process
        assert why is None and real is not None and not real.reused
        assert d.runner.budget.tests == 1
        why, _ = fail(d, REAL.replace("pair", "single"))
        assert why == ("not triaged: the first 1 failed test(s) of this process were"
                       " (--triage-max)")


def test_a_spent_budget_leaves_a_known_failure_triaged_and_triage_off_leaves_it_alone(tmp_path):
    spent = desk(tmp_path, max_tests=0)
    assert fail(spent, REAL)[0] is not None
    why, result = fail(spent, KNOWN)
    assert why is None and result is not None and engine_runs(spent) > 0
    off = desk(tmp_path)
    off.runner.budget.enabled = False
    assert fail(off, KNOWN) == (None, None) and engine_runs(off) == 0


def test_a_triage_cut_short_or_inconclusive_is_not_recorded(tmp_path):
    short = desk(tmp_path, seconds=0.0)  # the known failure's own budget: the process's seconds
    _, result = fail(short, KNOWN)
    assert result is not None and any(x.why == RAN_OUT for x in result.runs)
    assert "not recorded (cut short or inconclusive): triaged again next time" in result.note
    assert records_in(tmp_path) == []
    result = r.TriageResult(KNOWN, TOKEN_EQUALITY, r.INCONCLUSIVE, "inconclusive: ...")
    key = record_key(KNOWN, ENTRY, _run(), FACTS, POLICIES)
    assert TriageRecords.in_cache(tmp_path).keep(key, result) == "cut short or inconclusive"
    assert records_in(tmp_path) == []


def test_a_cache_that_cannot_be_written_leaves_the_triage_as_it_is(tmp_path):
    (tmp_path / "triage").write_text("a file where the folder would be")
    d = desk(tmp_path)
    _, result = fail(d, KNOWN)
    assert result is not None and result.key == r.DETERMINISTIC
    assert "not recorded (the cache could not be written" in result.note


def _run() -> FailedRun:
    return FailedRun(CFG, SCENARIO, "generate", TOKEN_EQUALITY, "r0",
                     reference=trace("cpu-ref", set()))


@pytest.mark.parametrize("damage", ["not json", "not a record", "another test"])
def test_a_damaged_record_is_triaged_again_and_replaced(tmp_path, damage):
    fail(desk(tmp_path), KNOWN)
    (path,) = records_in(tmp_path)
    entry = json.loads(path.read_text())
    if damage == "not json":
        path.write_text("{")
    elif damage == "not a record":
        path.write_text(json.dumps({"result": 3}))
    else:
        entry["result"]["nodeid"] = REAL
        path.write_text(json.dumps(entry))
    again = desk(tmp_path)
    _, result = fail(again, KNOWN)
    assert result is not None and not result.reused and engine_runs(again) > 0
    assert json.loads(path.read_text())["result"]["nodeid"] == KNOWN
    assert desk(tmp_path).records.find(
        record_key(KNOWN, ENTRY, _run(), FACTS, POLICIES, None)).result is not None


def test_the_key_is_stable_and_names_every_input():
    a = record_key(KNOWN, ENTRY, _run(), FACTS, POLICIES)
    b = record_key(KNOWN, ENTRY, _run(), FACTS, POLICIES)
    assert a == b and a.name == b.name
    assert set(a.valid_for) == {"format", "plan", "harness", "stack", "previous_stack", "model",
                                "engine", "scenario", "op", "check", "request", "teacher",
                                "reference", "facts", "policies"}
    assert "model" not in a.valid_for["engine"]  # the model is its content, not its path
    assert a.valid_for["policies"]["near_tie"].startswith("NearTiePolicy(")


def test_the_quarantine_says_which_entry_marked_a_test():
    def item(nodeid: str) -> SimpleNamespace:
        return SimpleNamespace(nodeid=nodeid, user_properties=[], add_marker=lambda m: None)

    apply_quarantine([item(KNOWN), item(REAL)], [ENTRY])
    assert quarantined_by(KNOWN) == ENTRY and quarantined_by(REAL) is None
    apply_quarantine([item(REAL)], [ENTRY])  # a new collection forgets the last
    assert quarantined_by(KNOWN) is None


def test_the_result_keeps_its_reuse_through_its_json_form():
    result = r.TriageResult(KNOWN, TOKEN_EQUALITY, r.DETERMINISTIC, "deterministic", (), 0.01,
                            reused_from="2026-12-07 03:12:45 UTC")
    assert r.TriageResult.from_dict(json.loads(json.dumps(result.to_dict()))) == result
    old = result.to_dict()
    del old["reused_from"]  # a statistics file of a harness before records
    assert not r.TriageResult.from_dict(old).reused


def session(cache) -> HilSession:
    """A session over the harness cache ``cache`` whose triage runs on the fake engines."""
    hil = HilSession(SessionOptions(cache_dir=cache, reports_dir=cache / "reports"))
    hil.triage.runner = TriageRunner(FakePool(), FakeDriver(always), POLICIES,
                                     hil.triage.runner.budget)
    hil.triage.known_failure = lambda nodeid: ENTRY if nodeid == KNOWN else None
    return hil


def test_a_session_records_in_its_cache_and_reports_a_reuse_as_costing_nothing(tmp_path):
    texts, timers = [], []
    for _ in range(2):  # two runs with the same cache
        hil = session(tmp_path)
        assert hil.triage.records is not None
        assert hil.triage.records.root == tmp_path / "triage"
        hil.begin_test(KNOWN)
        failed = trace(CFG.label, {"r0"})
        hil.triage.ran(CFG, SCENARIO, "generate", None, failed)
        hil.triage.referenced(SCENARIO, trace("cpu-ref", set()))
        with pytest.raises(VerdictFailed) as e:
            hil.expect(BAD, trace=failed)
        texts.append(e.value.verdict.details)
        timers.append(hil.timers.get("triage"))
        (entry,) = hil.stats().to_dict()["triage"]
    assert "(reused: triaged" not in texts[0] and "(reused: triaged" in texts[1]
    assert entry["reused_from"] and timers[1] < 0.5
