"""The session's verbs for verdicts, its listeners, and the pool presets, without engines."""

from __future__ import annotations

import json

import pytest

from harness.core.trace import Trace
from harness.core.verdict import Verdict, VerdictFailed
from harness.scenario.prompts import EngineLimits
from harness.session.facade import HilSession, SessionOptions
from harness.session.listeners import Listeners, SessionListener
from harness.targets.geometry import FULL_BATCH, pool_overrides


class Recorder(SessionListener):
    def __init__(self) -> None:
        self.seen: list[tuple[str, bool, Trace | None]] = []

    def on_verdict(self, verdict: Verdict, trace: Trace | None) -> None:
        self.seen.append((verdict.check, verdict.ok, trace))


class Broken(SessionListener):
    def on_verdict(self, verdict: Verdict, trace: Trace | None) -> None:
        raise RuntimeError("report bug")


def session(tmp_path) -> HilSession:
    return HilSession(SessionOptions(cache_dir=tmp_path, reports_dir=tmp_path))


def test_expect_records_every_verdict_then_raises_on_the_first_failure(tmp_path):
    hil = session(tmp_path)
    rec = Recorder()
    hil.add_listener(Broken())  # a listener that fails must not change the outcome
    hil.add_listener(rec)
    trace = Trace(target="t")
    good = Verdict.passed("full_batch", "4 at once")
    bad = Verdict.failed("no_preemption", "recompute: r1 preempted", at=3, details="recompute: r1\ntable")
    worse = Verdict.failed("kv_ledger.conservation", "kv invariant conservation broken at step 1")
    with pytest.raises(VerdictFailed) as failed:
        hil.expect(good, bad, worse, trace=trace)
    assert failed.value.verdict is bad
    assert str(failed.value) == "[check no_preemption] recompute: r1\ntable"
    assert rec.seen == [("full_batch", True, trace), ("no_preemption", False, trace),
                        ("kv_ledger.conservation", False, trace)]
    hil.remove_listener(rec)
    hil.expect(good)
    assert len(rec.seen) == 3


def test_a_negative_control_fails_when_the_detector_is_blind(tmp_path):
    hil = session(tmp_path)
    tripped = Verdict.failed("full_batch", "full batch never reached: largest batch seen was 3")
    hil.expect_failure(tripped, "largest batch seen was 3")
    with pytest.raises(VerdictFailed) as blind:
        hil.expect_failure(Verdict.passed("full_batch"), "largest batch seen was 3")
    assert blind.value.verdict.check == "full_batch.negative_control"
    assert "did not fail" in blind.value.verdict.why
    with pytest.raises(VerdictFailed):
        hil.expect_failure(tripped, "largest batch seen was 2")


def test_a_verdict_is_false_when_it_failed():
    assert Verdict.passed("x") and not Verdict.failed("x", "why")
    assert Verdict.failed("kv_ledger.ref_counts", "w").family == "kv_ledger"


def test_listeners_fan_out_in_order():
    fan = Listeners()
    a, b = Recorder(), Recorder()
    fan.add(a)
    fan.add(Broken())
    fan.add(b)
    fan.on_verdict(Verdict.passed("c"), None)
    assert a.seen == b.seen == [("c", True, None)]


def test_full_batch_pool_preset_per_target():
    limits = EngineLimits(256, 4)
    cpu = pool_overrides("vllm-cpu", FULL_BATCH, limits)
    assert cpu == {"block_size": 16, "num_blocks_override": 4 * 16 + 1}
    # vLLM 0.32's CPU attention takes multiples of 32 only
    assert pool_overrides("vllm-cpu", FULL_BATCH, limits, "canary") == {
        "block_size": 32, "num_blocks_override": 4 * 8 + 1}
    assert pool_overrides("spyre", FULL_BATCH, limits) == {}  # the device sizes its pool
    assert pool_overrides("vllm-cpu", None, limits) == {}
    with pytest.raises(ValueError, match="unknown pool preset 'huge'"):
        pool_overrides("vllm-cpu", "huge", limits)


def test_stats_record_keeps_the_summary_shape(tmp_path):
    hil = session(tmp_path)
    hil.near_ties.append("vllm-cpu s request r0 position 3")
    with hil.timed("checks"):
        pass
    data = hil.stats().to_dict()
    assert set(data) == {"engines_started", "engines", "reference_hits", "reference_misses", "reference_bad",
                         "near_ties", "timers", "exposure", "leases", "cards", "hygiene", "agreement",
                         "triage", "calibrations", "warnings"}
    assert data["engines_started"] == 0 and data["near_ties"] == ["vllm-cpu s request r0 position 3"]
    assert "checks" in data["timers"]
    written = json.loads(hil.write_stats("gw0", ["quarantine: q: #1 matches nothing"]).read_text())
    assert written["warnings"] == ["quarantine: q: #1 matches nothing"]
