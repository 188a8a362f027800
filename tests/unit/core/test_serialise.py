"""KV snapshots and traces with step records survive the JSON wire format."""

from __future__ import annotations

import json

from harness.core.serialise import (
    snapshot_from_dict,
    snapshot_to_dict,
    trace_from_dict,
    trace_to_dict,
)
from harness.core.trace import (
    KvSnapshot,
    RequestTrace,
    StepRecord,
    TokenStep,
    Trace,
)
from harness.targets.spyre.ledger_sources import SOURCE_SPYRE_LEGACY_RUNNER
from tests.unit.kv_snapshots import healthy, idle


def test_roundtrip_through_json() -> None:
    s = healthy()
    d = json.loads(json.dumps(snapshot_to_dict(s)))
    assert all(isinstance(k, str) for k in d["ref_counts"])
    assert snapshot_from_dict(d) == s
    bare = KvSnapshot(source=SOURCE_SPYRE_LEGACY_RUNNER, num_blocks=4, free_blocks=[0, 1, 1])
    assert snapshot_from_dict(json.loads(json.dumps(snapshot_to_dict(bare)))) == bare


def test_trace_with_step_records_roundtrips_through_json() -> None:
    req = RequestTrace("r0", [1, 2], [TokenStep(7, -0.5, {7: -0.5, 8: -1.0})], 1, "length")
    trace = Trace(
        target="t",
        requests={"r0": req},
        steps=[StepRecord(0, running=["r0"], preempted=["r1"], preemptions={"r0": 1},
                          scheduled=True, num_scheduled_tokens=3, tkv=64, kv=[healthy()])],
        initial=StepRecord(-1, kv=[idle()]),
        idle_at_end=True,
        metrics={"vllm:num_preemptions": 1.0},
        info={"pid": 1},
    )
    assert trace_from_dict(json.loads(json.dumps(trace_to_dict(trace)))) == trace


def test_an_aborted_request_roundtrips_apart_from_the_finished_ones() -> None:
    done = RequestTrace("r1", [3], [TokenStep(7, -0.5, {7: -0.5})], finish_reason="length")
    gone = RequestTrace("r0", [1, 2], [TokenStep(7, float("nan"), {})], finish_reason="abort",
                        num_cached_tokens=64, max_tokens=9, aborted_at=11)
    trace = Trace(target="t", requests={"r1": done}, aborted={"r0": gone})
    wire = json.loads(json.dumps(trace_to_dict(trace)))
    back = trace_from_dict(wire)
    assert back.aborted["r0"].aborted_at == 11 and back.aborted["r0"].token_ids == [7]
    assert list(back.requests) == ["r1"] and back.requests["r1"].aborted_at is None
    assert list(back.ran()) == ["r0", "r1"]
    # a trace without aborted requests keeps its earlier wire shape (cached references)
    assert "aborted" not in trace_to_dict(Trace(target="t", requests={"r1": done}))
    assert "aborted_at" not in wire["requests"]["r1"]


def test_from_dict_fills_missing_optional_keys() -> None:
    s = snapshot_from_dict({"source": "vllm-scheduler", "num_blocks": 3, "free_blocks": [1, 2]})
    assert s.owned == {} and s.reserved is None and s.ref_counts is None
