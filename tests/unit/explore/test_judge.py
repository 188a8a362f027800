"""The judge asks of each example what the suites ask of such a run: the batch checks follow
from the geometry (a binding TKV limit, a pool that holds the batch or a smaller one), a full
batch only where the workload must fill it, block boundaries only where blocks follow tokens
(a known failure of the stack told apart from a finding: test_known.py)."""

from __future__ import annotations

from harness.core.trace import (
    SOURCE_VLLM_SCHEDULER,
    KvSnapshot,
    RequestTrace,
    StepRecord,
    TokenStep,
    Trace,
)
from harness.core.verdict import FULL_BATCH, NO_PREEMPTION, Verdict
from harness.explore.example import RequestShape, geometry_of
from harness.explore.judge import batch_verdicts, boundary_verdicts, full_batch_expected
from harness.scenario.prompts import EngineLimits, RequestSpec, Scenario

BASE = {"max_model_len": 256, "max_num_seqs": 2, "chunk_size": 128}
FULL = geometry_of({**BASE, "pool": "full-batch"})
TIGHT = geometry_of({**BASE, "pool_requests": 1})
BOUND = geometry_of({**BASE, "pool": "full-batch", "batch_tkv_limit": 256})
LONG = (RequestShape(64, 10), RequestShape(64, 10))


def run(paused: bool = False, prefix_caching: bool = False) -> Trace:
    """Two requests of 4 prompt tokens and 2 outputs, run together (one paused, if asked)."""
    pool = KvSnapshot(source=SOURCE_VLLM_SCHEDULER, num_blocks=5, pad_blocks=[0],
                      free_blocks=[3, 4], owned={"r0": [1], "r1": [2]}, block_size=16,
                      prefix_caching=prefix_caching)
    steps = [StepRecord(step=0, running=["r0", "r1"], executed={"r0": 4, "r1": 4}, kv=[pool]),
             StepRecord(step=1, running=["r0", "r1"], executed={"r0": 1, "r1": 1},
                        paused=["r1"] if paused else [], kv=[pool])]
    tokens = [TokenStep(5, -0.1, {5: -0.1}), TokenStep(6, -0.1, {6: -0.1})]
    requests = {r: RequestTrace(r, [1, 2, 3, 4], list(tokens)) for r in ("r0", "r1")}
    return Trace(target="t", steps=steps, requests=requests,
                 metrics={"vllm:num_preemptions": 0.0})


def checks(verdicts: list[Verdict]) -> list[str]:
    return [v.check for v in verdicts]


def test_a_full_batch_is_expected_only_where_the_workload_must_fill_it():
    assert full_batch_expected(FULL, LONG)
    assert not full_batch_expected(FULL, LONG[:1])  # fewer requests than the batch
    assert not full_batch_expected(FULL, (RequestShape(64, 10), RequestShape(64, 10, arrival=1)))
    assert not full_batch_expected(FULL, (RequestShape(64, 10),
                                          RequestShape(64, 10, abort_after=2)))
    # two chunks each: the first must outlast both prefills (2 x 4 chunks + 2 tokens)
    assert not full_batch_expected(FULL, (RequestShape(200, 9), RequestShape(200, 20)))
    assert full_batch_expected(FULL, (RequestShape(200, 10), RequestShape(200, 10)))


def test_a_pool_that_holds_the_batch_may_neither_preempt_nor_pause():
    assert checks(batch_verdicts(FULL, LONG, (), run())) == [NO_PREEMPTION, FULL_BATCH]
    assert all(batch_verdicts(FULL, LONG, (), run()))
    paused = batch_verdicts(FULL, LONG, (), run(paused=True))
    assert not paused[0].ok and "pause:" in paused[0].why
    # a scheduler that may hold a newcomer back for its TKV is not asked for a full batch
    assert checks(batch_verdicts(FULL, LONG, (), run(), holds_back_for_tkv=True)) == [
        NO_PREEMPTION]


def test_a_binding_tkv_limit_allows_pauses_but_no_recompute():
    verdicts = batch_verdicts(BOUND, LONG, (), run(paused=True))
    assert checks(verdicts) == [NO_PREEMPTION] and verdicts[0].ok


def test_a_smaller_pool_asks_no_recompute_only_of_a_scheduler_that_holds_back():
    assert batch_verdicts(TIGHT, LONG, ("kv_ledger",), run()) == []
    assert checks(batch_verdicts(TIGHT, LONG, ("holds_back_on_blocks",), run())) == [
        NO_PREEMPTION]


def test_block_boundaries_are_judged_where_blocks_follow_tokens():
    sized = ("kv_ledger", "harness_sized_pool")
    assert checks(boundary_verdicts(LONG, sized, run())) == ["kv_ledger.block_boundary"]
    assert boundary_verdicts(LONG, ("kv_ledger",), run()) == []  # a pool the device sizes
    assert boundary_verdicts(LONG, sized, run(prefix_caching=True)) == []  # shared blocks
    assert boundary_verdicts((RequestShape(4, 1),), sized, run()) == []  # done in one step


def test_a_full_batch_pool_must_hold_a_full_batch_where_the_engine_really_holds_it():
    """The geometry's full-batch pool (on Spyre the device's own count) is judged by what
    the engine holds: the scheduler's pool, and the device's KV cache where it is read."""
    from dataclasses import replace

    from harness.core.verdict import CAPACITY
    from harness.explore.judge import capacity_verdicts

    small = geometry_of({"max_model_len": 32, "max_num_seqs": 2, "chunk_size": 32,
                         "pool": "full-batch"})  # 2 x 2 blocks of 16 + the pad block: 5
    (held,) = capacity_verdicts(small, run())
    assert held.check == CAPACITY and held.ok
    short = run()
    short.steps[0].kv[0] = replace(short.steps[0].kv[0], device_blocks=4)
    (verdict,) = capacity_verdicts(small, short)
    assert not verdict.ok and "the device allocated 4 blocks" in verdict.why
    # a pool the geometry does not call a full batch's is judged by what it holds, not here
    assert capacity_verdicts(geometry_of({**BASE, "pool_requests": 1}), run()) == []


def prefix_run(reported: int) -> Trace:
    """r0 computes 40 tokens; r1, sharing its first 32, starts after it and reports
    ``reported`` cached tokens, running the rest of its 40."""
    pool = KvSnapshot(source=SOURCE_VLLM_SCHEDULER, num_blocks=12, pad_blocks=[0],
                      free_blocks=list(range(4, 12)), owned={"r0": [1, 2, 3]}, block_size=16,
                      prefix_caching=True)
    shared = list(range(100, 132))
    steps = [StepRecord(step=0, running=["r0"], executed={"r0": 40}, kv=[pool]),
             StepRecord(step=1, running=["r0"], executed={"r0": 1}, kv=[pool]),
             StepRecord(step=2, running=["r1"], executed={"r1": 40 - reported}, kv=[pool]),
             StepRecord(step=3, running=["r1"], executed={"r1": 1}, kv=[pool])]
    tokens = [TokenStep(5, -0.1, {5: -0.1}), TokenStep(6, -0.1, {6: -0.1})]
    requests = {"r0": RequestTrace("r0", shared + [1] * 8, list(tokens)),
                "r1": RequestTrace("r1", shared + [2] * 8, list(tokens),
                                   num_cached_tokens=reported)}
    return Trace(target="t", steps=steps, requests=requests,
                 metrics={"vllm:num_preemptions": 0.0})


def scenario_of(trace: Trace, aborted: dict[str, list[int]] | None = None) -> Scenario:
    """The scenario of ``trace``'s requests, and of ``aborted`` ones (id -> prompt) the trace
    holds no output of."""
    specs = [RequestSpec(request_id=r, prompt_token_ids=tuple(t.prompt_token_ids), max_tokens=2)
             for r, t in trace.requests.items()]
    specs += [RequestSpec(request_id=r, prompt_token_ids=tuple(p), max_tokens=2, abort_step=1)
              for r, p in (aborted or {}).items()]
    return Scenario("prefix", specs, EngineLimits(max_model_len=256, max_num_seqs=2))


def test_with_prefix_caching_a_prompt_served_again_is_judged_where_nothing_was_evicted():
    from harness.explore.judge import prefix_verdicts

    pc = geometry_of({**BASE, "pool": "full-batch", "prefix_caching": True})
    two = (RequestShape(40, 2, family=1, shared=32), RequestShape(40, 2, arrival=2, family=1,
                                                                   shared=32))
    caps = ("kv_ledger", "prefix_caching")
    (ok,) = prefix_verdicts(pc, two, caps, scenario_of(prefix_run(32)), prefix_run(32))
    assert ok.ok and ok.check == "kv_ledger.prefix_reuse", ok.why
    (dropped,) = prefix_verdicts(pc, two, caps, scenario_of(prefix_run(16)), prefix_run(16))
    assert not dropped.ok and "computed 16 tokens the cache held" in dropped.why
    # not judged: prefix caching off, a kind without it, or a pool that may have evicted
    run16 = prefix_run(16)
    assert prefix_verdicts(FULL, two, caps, scenario_of(run16), run16) == []
    assert prefix_verdicts(pc, two, ("kv_ledger",), scenario_of(run16), run16) == []
    many = two * 20  # more blocks than the pool's 11: a cached block may be taken again
    assert prefix_verdicts(pc, many, caps, scenario_of(run16), run16) == []
    preempted = prefix_run(16)
    preempted.metrics["vllm:num_preemptions"] = 1.0  # a recompute serves a prompt twice
    assert prefix_verdicts(pc, two, caps, scenario_of(preempted), preempted) == []


def test_an_aborted_request_is_not_judged_but_its_computed_blocks_serve_the_others():
    """r0 computes 40 tokens and is aborted (the trace holds no output of it); r1 served the
    32 tokens it shares is right, though no request of the trace computed them."""
    from harness.explore.judge import prefix_verdicts

    pc = geometry_of({**BASE, "pool": "full-batch", "prefix_caching": True})
    two = (RequestShape(40, 2, family=1, shared=32, abort_after=1),
           RequestShape(40, 2, arrival=2, family=1, shared=32))
    caps = ("kv_ledger", "prefix_caching")
    run32 = prefix_run(32)
    r0 = run32.requests.pop("r0")
    (verdict,) = prefix_verdicts(pc, two, caps, scenario_of(run32, {"r0": r0.prompt_token_ids}),
                                 run32)
    assert verdict.ok, verdict.why
    # without its prompt the hit would be unexplained: the false alarm the scenario prevents
    (blind,) = prefix_verdicts(pc, two, caps, scenario_of(run32), run32)
    assert not blind.ok and "reports 32 cached tokens but shares no prefix" in blind.why
