"""Engine hygiene: an engine handed from one test to the next is checked, a dirty one replaced
(or, where it cannot be, judged as inherited state); the report groups failures by root cause.

Fakes stand for the engine pool and hosts only (the seam the hygiene drives); the ledgers are
hand-built snapshots, as in tests/unit/checks/test_ledger.py.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from typing import Any

import pytest

from harness.checks.ledger import check_idle_ledgers, check_ledger
from harness.core.errors import EngineCrashed, EngineRequestError
from harness.core.trace import KvSnapshot, StepRecord, Trace
from harness.core.verdict import INHERITED_STATE
from harness.engine.device_ledger import DeviceLedger, ledger_problems, ledger_summary_lines
from harness.engine.hygiene import (
    EngineHygiene,
    idle_problems,
    judge_snapshots,
    judge_trace,
)
from harness.in_engine import fault_registry as registry
from harness.in_engine import faults
from harness.report.categories import classify
from harness.report.root_cause import (
    group_by_root_cause,
    hygiene_lines,
    labels_for,
    root_cause_markdown,
)
from harness.targets.spyre.ledger_sources import SOURCE_SPYRE_RUNNER


def clean() -> KvSnapshot:
    return KvSnapshot(source=SOURCE_SPYRE_RUNNER, num_blocks=6, pad_blocks=[0],
                      free_blocks=[1, 2, 3, 4, 5], reserved={}, reported_free=5, counted_free=5,
                      ref_counts={})


def leaked(*lost: int, miscount: int = 0) -> KvSnapshot:
    """Idle, but ``lost`` blocks are neither free nor owned (a free that forgot them); the
    runner reports ``miscount`` more free blocks than the ledger has."""
    free = [b for b in range(1, 6) if b not in lost]
    return KvSnapshot(source=SOURCE_SPYRE_RUNNER, num_blocks=6, pad_blocks=[0], free_blocks=free,
                      reserved={}, reported_free=len(free) + miscount, counted_free=len(free),
                      ref_counts={b: 1 for b in lost})


def running(owned: dict[str, list[int]], *lost: int, miscount: int = 0) -> KvSnapshot:
    taken = {b for ids in owned.values() for b in ids} | set(lost)
    free = [b for b in range(1, 6) if b not in taken]
    return KvSnapshot(source=SOURCE_SPYRE_RUNNER, num_blocks=6, pad_blocks=[0], free_blocks=free,
                      owned=owned, reserved={r: len(b) for r, b in owned.items()},
                      reported_free=len(free) + miscount, counted_free=len(free),
                      ref_counts={b: 1 for b in taken})


def steps_trace(initial: KvSnapshot, *snaps: KvSnapshot) -> Trace:
    """A drained step-driven run of r0: the last snapshot is the idle end."""
    steps = [StepRecord(i, running=["r0"], kv=[s]) for i, s in enumerate(snaps)]
    return Trace(target="spyre-eager-cb", steps=steps, initial=StepRecord(-1, kv=[initial]),
                 idle_at_end=True)


@dataclass(frozen=True)
class Cfg:
    key: str = "spyre-eager-cb:abc"
    label: str = "spyre-eager-cb"


class FakeHost:
    def __init__(self, n: int) -> None:
        self.n = n
        self.state: list[KvSnapshot] = [clean()]  # what a probe reads
        self.broken = False


class FakePool:
    """Starts a FakeHost per configuration; ``start_state`` is a fresh engine's ledger."""

    def __init__(self) -> None:
        self.live: dict[str, FakeHost] = {}
        self.starts = 0
        self.start_state: list[KvSnapshot] = [clean()]

    def get(self, cfg: Cfg) -> FakeHost:
        if cfg.key not in self.live:
            self.starts += 1
            self.live[cfg.key] = FakeHost(self.starts)
            self.live[cfg.key].state = list(self.start_state)
        return self.live[cfg.key]

    def replace(self, cfg: Cfg) -> FakeHost:
        self.live.pop(cfg.key, None)
        return self.get(cfg)


class World:
    def __init__(self, replace: bool = True) -> None:
        self.pool = FakePool()
        self.test = "t1"
        self.probes: list[int] = []
        self.hygiene = EngineHygiene(self._probe, lambda: self.test, replace=replace)

    def _probe(self, host: Any) -> list[KvSnapshot]:
        self.probes.append(host.n)
        if host.broken:
            raise EngineCrashed("engine spyre-eager-cb died with exit code 3 during a call")
        return host.state

    def run(self, test: str, trace: Trace | None = None, cfg: Cfg = Cfg()) -> FakeHost:
        """``test`` runs ``trace`` (None: a generate(): no ledger seen) on the engine of cfg."""
        self.test = test
        host = self.hygiene.engine_for(cfg, self.pool)  # type: ignore[arg-type]
        self.hygiene.calling(cfg)  # type: ignore[arg-type]
        self.hygiene.after_trace(cfg, trace or Trace(target=cfg.label))  # type: ignore[arg-type]
        if trace is not None and trace.steps:
            host.state = trace.steps[-1].kv
        return host


def test_a_clean_run_restarts_nothing_and_probes_only_after_a_run_without_ledgers():
    w = World()
    first = w.run("t1", steps_trace(clean(), running({"r0": [1]}), clean()))
    assert w.run("t2", steps_trace(clean(), clean())) is first  # end state known: no call
    assert w.probes == []
    w.run("t3")  # generate(): the state it left is unknown
    assert w.run("t4", steps_trace(clean(), clean())) is first
    assert w.probes == [1]  # one probe, before t4
    assert w.hygiene.stats.restarts == 0 and w.pool.starts == 1
    assert w.hygiene.stats.checks == 3 and w.hygiene.events == []


def test_an_engine_left_dirty_is_replaced_for_the_next_test_and_the_leak_is_named():
    w = World()
    first = w.run("t1", steps_trace(clean(), running({"r0": [1, 2]}), leaked(2)))
    second = w.run("t2", steps_trace(clean(), clean()))
    assert second is not first and w.pool.starts == 2
    (event,) = w.hygiene.events
    assert event.left_by == "t1" and event.test == "t2" and event.replaced
    assert any("[conservation]" in p and "[2]" in p for p in event.problems)
    assert "left dirty by t1" in event.describe() and "replaced by a fresh engine" in event.describe()
    assert w.probes == [2]  # the fresh engine's start state, learnt once
    w.run("t3", steps_trace(clean(), clean()))
    assert w.hygiene.stats.restarts == 1 and w.pool.starts == 2
    assert w.hygiene.affecting("t2") == [event] and w.hygiene.affecting("t3") == []


def test_a_request_left_in_the_engine_is_dirt_too():
    w = World()
    host = w.run("t1")  # a generate that left a request holding blocks
    host.state = [running({"r9": [3]})]
    w.run("t2", steps_trace(clean(), clean()))
    (event,) = w.hygiene.events
    assert any("still owns blocks [3]" in p for p in event.problems)


def test_an_engine_that_cannot_answer_the_check_is_replaced():
    w = World()
    host = w.run("t1")
    host.broken = True
    assert w.run("t2") is not host
    assert "[probe] the engine did not answer" in w.hygiene.events[0].problems[0]


def test_an_engine_without_a_readable_ledger_is_not_restarted_for_it():
    w = World()
    w.run("t1")

    def refuse(host: Any) -> list[KvSnapshot]:
        raise EngineRequestError("engine neuron raised AttributeError: no kv_cache_manager")

    w.hygiene.probe = refuse
    w.run("t2")
    assert w.pool.starts == 1 and w.hygiene.events == []
    assert "no kv_cache_manager" in w.hygiene.stats.unreadable[0]


def test_a_configuration_that_starts_dirty_is_not_restarted_again_and_again():
    w = World()
    w.pool.start_state = [leaked(5)]  # e.g. warmup leaks a block: every fresh engine has it
    first = w.run("t1", steps_trace(leaked(5), running({"r0": [1]}, 5), leaked(5)))
    assert w.run("t2", steps_trace(leaked(5), leaked(5))) is first  # its start-up, not t1's
    assert w.hygiene.events == [] and w.pool.starts == 1
    # Learnt only from a replacement when no run showed the start state first.
    w2 = World()
    w2.pool.start_state = [leaked(5)]
    w2.run("t1")
    w2.run("t2")
    w2.run("t3")
    assert w2.pool.starts == 2 and w2.hygiene.stats.restarts == 1
    assert w2.hygiene.events[0].left_by == "" and "start-up" in w2.hygiene.events[0].note


def test_without_replacement_the_next_tests_inherit_and_name_the_first_culprit():
    w = World(replace=False)
    first = w.run("t1", steps_trace(clean(), running({"r0": [1, 2]}), leaked(2)))
    assert w.run("t2", steps_trace(leaked(2), leaked(2))) is first
    w.run("t3", steps_trace(leaked(2), leaked(2)))
    assert [(e.left_by, e.test, e.replaced) for e in w.hygiene.events] == [
        ("t1", "t2", False), ("t1", "t3", False)]
    assert w.hygiene.inherited("t3", "spyre-eager-cb") is w.hygiene.events[1]
    assert w.pool.starts == 1
    # A test that adds a leak of its own to what it inherited is the next one's culprit.
    w.run("t4", steps_trace(leaked(2), running({"r0": [1]}, 2), leaked(2, 3)))
    w.run("t5", steps_trace(leaked(2, 3), leaked(2, 3)))
    assert w.hygiene.events[-1].left_by == "t4"


def inherited_event() -> Any:
    w = World(replace=False)
    w.run("t1", steps_trace(clean(), running({"r0": [1, 2]}), leaked(2)))
    w.run("t2", steps_trace(leaked(2), leaked(2)))
    return w.hygiene.events[0]


def test_an_inherited_leak_alone_is_inherited_state_not_a_block_leak():
    event = inherited_event()
    trace = steps_trace(leaked(2), running({"r0": [1]}, 2), leaked(2))
    plain = check_ledger(trace)
    assert plain.check.startswith("kv_ledger.") and plain.at == -1  # what it was before
    v = judge_trace(trace, event, plain)
    assert v.check == INHERITED_STATE and not v.ok
    assert "left dirty by t1" in v.why and "own run broke no ledger invariant" in v.why
    assert classify("failed", v.message(), v.check) == "inherited state"
    assert classify("failed", v.message()) == "inherited state"  # as Allure files it


def test_a_test_that_leaks_on_an_inherited_engine_fails_at_its_own_step():
    event = inherited_event()
    trace = steps_trace(leaked(2), running({"r0": [1]}, 2), running({"r0": [1, 3]}, 2),
                        leaked(2, 3))
    v = judge_trace(trace, event, check_ledger(trace))
    assert v.check == "kv_ledger.conservation" and v.at == 2, v.details
    assert "broken at step 2" in v.why and "[2, 3]" in v.why
    assert "not counted, inherited from t1" in v.details


def test_an_idle_check_on_an_inherited_engine_counts_only_what_is_new():
    event = inherited_event()
    same = [leaked(2)]
    assert judge_snapshots(same, event, check_idle_ledgers(same)).check == INHERITED_STATE
    worse = [running({"warmup-0": [4]}, 2)]
    v = judge_snapshots(worse, event, check_idle_ledgers(worse))
    assert v.check == "kv_ledger.idle_all_free" and "warmup-0 still owns blocks [4]" in v.why
    assert judge_snapshots([clean()], event, check_idle_ledgers([clean()])).ok


def test_an_inherited_miscount_is_the_same_offset_whatever_the_counts():
    """The runner's free count stays one off after the leak: 5 vs 4 idle, 4 vs 3 running."""
    w = World(replace=False)
    w.run("t1", steps_trace(clean(), running({"r0": [1, 2]}), leaked(2, miscount=1)))
    w.run("t2")
    w.pool.live[Cfg().key].state = [leaked(2, miscount=1)]
    w.run("t3")
    event = w.hygiene.events[-1]
    assert any("[reported_free]" in p for p in event.problems)
    same = steps_trace(leaked(2, miscount=1), running({"r0": [1]}, 2, miscount=1),
                       leaked(2, miscount=1))
    assert judge_trace(same, event, check_ledger(same)).check == INHERITED_STATE
    worse = steps_trace(leaked(2, miscount=1), running({"r0": [1]}, 2, miscount=2),
                        leaked(2, miscount=1))
    v = judge_trace(worse, event, check_ledger(worse))
    assert v.check == "kv_ledger.reported_free" and v.at == 0, v.details


def test_idle_problems_are_step_free_lines_equal_for_equal_states():
    assert idle_problems([clean()]) == ()
    assert idle_problems([leaked(3)]) == idle_problems([leaked(3)])
    assert idle_problems([leaked(3)]) != idle_problems([leaked(3, 4)])


# ------------------------------------------------------------------ report


def result(name: str, status: str, message: str = "", labels: list[tuple[str, str]] = ()) -> dict:
    return {"name": name, "status": status, "statusDetails": {"message": message},
            "labels": [{"name": "nodeid", "value": name}]
            + [{"name": k, "value": v} for k, v in labels]}


def test_failures_group_by_the_test_that_first_broke_the_engine():
    w = World(replace=False)
    w.run("a", steps_trace(clean(), running({"r0": [1, 2]}), leaked(2)))
    w.run("b", steps_trace(leaked(2), leaked(2)))
    w.run("c", steps_trace(leaked(2), leaked(2)))
    tests = [
        result("a", "failed", "VerdictFailed: [check kv_ledger.conservation] broken at step 4"),
        result("b", "failed", "VerdictFailed: [check inherited_state] engine ...",
               labels_for(w.hygiene.affecting("b"))),
        result("c", "passed", "", labels_for(w.hygiene.affecting("c"))),
        result("d", "failed", "VerdictFailed: [check token_equality] mismatch"),
    ]
    (group,) = group_by_root_cause(tests)
    assert group.culprit == "a" and group.status == "failed"
    assert [(x.name, x.handling, x.status) for x in group.affected] == [
        ("b", "inherited", "failed"), ("c", "inherited", "passed")]
    stats = [{"restarts": 0, "probes": 0, "checks": 2, "events": w.hygiene.stats.events}]
    md = root_cause_markdown(tests, stats)
    assert "Engine restarts (dirty engines replaced): 0" in md
    assert md.index("- `a` (failed") < md.index("  - then `b` inherited the engine: failed")
    assert "[conservation]" in md
    lines = hygiene_lines(stats)
    assert lines[0].startswith("engine hygiene: 0 restart(s)")
    assert "left dirty by a" in lines[1] and "inherited (--no-engine-replace) for b" in lines[1]


def test_a_clean_run_says_so_and_counts_no_restart():
    md = root_cause_markdown([result("a", "passed")], [{"restarts": 0, "probes": 1, "checks": 3}])
    assert "Engine restarts (dirty engines replaced): 0" in md
    assert "No test left an engine dirty" in md
    assert root_cause_markdown([result("a", "passed")], []) == ""


def test_a_replacement_on_a_card_is_not_a_second_start_of_its_configuration():
    ledger = DeviceLedger()
    cfg = types.SimpleNamespace(device="card0", label="spyre-sendnn-cb", key="k1")
    ledger.started(cfg)
    ledger.closed("k1")
    ledger.started(cfg)
    assert ledger_problems(ledger.events) == ["card0: configuration k1 started 2 times"]
    ledger.mark_replacement("k1")
    assert ledger_problems(ledger.events) == []


def test_a_triage_start_on_a_card_is_not_a_second_start_of_its_configuration():
    ledger = DeviceLedger()
    cfg = types.SimpleNamespace(device="card0", label="spyre-sendnn-cp", key="k1")
    ledger.started(cfg)
    ledger.closed("k1")
    ledger.started(cfg, purpose="triage")
    ledger.closed("k1")
    ledger.started(cfg, purpose="triage")
    assert ledger_problems(ledger.events) == []
    (line,) = ledger_summary_lines(ledger.events)
    assert line.count("(triage)") == 2
    ledger.started(types.SimpleNamespace(device="card0", label="x", key="k2"), purpose="triage")
    assert ledger_problems(ledger.events) == [
        "card0: x started while ['k1'] still live"]  # one engine per card holds for triage too


# ------------------------------------------------------------------ faults


class FakeBlock:
    def __init__(self, block_id: int) -> None:
        self.block_id = block_id


@pytest.fixture
def fake_block_pool(monkeypatch):
    """A stand-in for vllm.v1.core.block_pool (importing vLLM picks a platform: too heavy)."""
    freed: list[list[int]] = []

    class BlockPool:
        def free_blocks(self, ordered_blocks: Any) -> None:
            freed.append([b.block_id for b in ordered_blocks])

    for name in ("vllm", "vllm.v1", "vllm.v1.core", "vllm.v1.core.block_pool"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sys.modules["vllm.v1.core.block_pool"].BlockPool = BlockPool  # type: ignore[attr-defined]
    monkeypatch.setitem(registry._armed, "on", True)
    return BlockPool, freed


def free_twice(pool_cls: Any) -> None:
    pool = pool_cls()
    pool.free_blocks([FakeBlock(1), FakeBlock(2)])
    pool.free_blocks([FakeBlock(3), FakeBlock(4)])


def test_forget_free_once_fires_once_per_process_not_per_engine(fake_block_pool, tmp_path,
                                                                 monkeypatch):
    pool_cls, freed = fake_block_pool
    original = pool_cls.free_blocks
    monkeypatch.setenv(faults.FAULT_STATE_ENV, str(tmp_path))
    faults.FAULTS["forget-free-once"]({"target": "vllm-cpu"})  # the first engine
    free_twice(pool_cls)
    assert freed == [[1], [3, 4]]
    pool_cls.free_blocks = original
    faults.FAULTS["forget-free-once"]({"target": "vllm-cpu"})  # its replacement, later in the run
    free_twice(pool_cls)
    assert freed[2:] == [[1, 2], [3, 4]]


def test_forget_free_each_forgets_a_block_of_every_request(fake_block_pool):
    pool_cls, freed = fake_block_pool
    faults.FAULTS["forget-free-each"]({"target": "vllm-cpu"})
    free_twice(pool_cls)
    assert freed == [[1], [3]]
    assert {"forget-free-once", "forget-free-each"} <= set(faults.FAULTS)


def test_a_once_guard_fires_at_its_chance_and_a_kind_registers_its_faults(monkeypatch, capsys):
    once = registry.Once(after=1)
    assert not once.due()  # dormant until armed: not even a chance
    monkeypatch.setitem(registry._armed, "on", True)
    assert [once.due(), once.due(), once.due()] == [False, True, True]  # due until fired
    once.fire("[hil] fault probe fired")
    assert not once.due() and capsys.readouterr().out == "[hil] fault probe fired\n"
    assert faults.FAULTS["reserve-short"].__module__ == "harness.targets.spyre.faults"
    assert registry.run_target_hook(registry.LEDGER_POOL, {"target": "vllm-cpu"}) is None


def test_the_run_summary_file_has_the_root_cause_section_and_restart_count(tmp_path):
    import json

    from harness.report.summary import write_summary

    results = tmp_path / "allure-results"
    results.mkdir()
    culprit = "suites/t.py::leaks"
    tests = [
        result(culprit, "failed", "VerdictFailed: [check kv_ledger.conservation] kv invariant"
               " conservation broken at step 40"),
        result("suites/t.py::next", "passed", "",
               [("root_cause", culprit), ("engine_hygiene", "replaced"),
                ("engine_dirt", "spyre-eager-cb: [conservation] spyre-runner: 1 of 20 blocks")]),
    ]
    for i, t in enumerate(tests):
        t["uuid"] = f"u{i}"
        (results / f"u{i}-result.json").write_text(json.dumps(t))
    (tmp_path / "stats").mkdir()
    (tmp_path / "stats" / "main.json").write_text(json.dumps(
        {"hygiene": {"restarts": 1, "probes": 1, "checks": 3, "events": []}}))
    text = write_summary(results, tmp_path / "summary.md")
    assert "## Failures by root cause" in text
    assert "Engine restarts (dirty engines replaced): 1" in text
    assert f"- `{culprit}` (failed: " in text
    assert "  - then `suites/t.py::next` ran on a fresh engine: passed" in text


def test_the_cards_section_skips_damaged_worker_statistics(tmp_path):
    from harness.engine.device_ledger import append_device_summary

    stats = tmp_path / "stats"
    stats.mkdir()
    (stats / "gw0.json").write_text("{not json")
    (stats / "gw1.json").write_text("[1]")
    (stats / "gw2.json").write_text('{"cards": 3}')
    summary = tmp_path / "summary.md"
    summary.write_text("# run\n")
    assert append_device_summary(stats, summary) == ""
    assert summary.read_text() == "# run\n"
