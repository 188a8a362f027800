"""The triage plan: one condition varied per probe, and the reasons a probe is not made."""

from __future__ import annotations

from harness.core.config import EngineConfig
from harness.core.trace import Trace
from harness.core.verdict import FORCED_TOKENS, KV_LEDGER, TOKEN_EQUALITY
from harness.scenario.prompts import EngineLimits, RequestSpec, Scenario
from harness.triage.plan import (
    BATCHING,
    CHUNKED,
    PREFIX,
    RECYCLED,
    REPEAT,
    STACK,
    Cycle,
    Facts,
    FailedRun,
    Judge,
    Warm,
    plan,
)

LIMITS = EngineLimits(256, 4, cp_chunk=128)


def scenario(*lengths: int) -> Scenario:
    reqs = [RequestSpec(f"r{i}", tuple(range(1, n + 1)), 8, arrival_step=i)
            for i, n in enumerate(lengths)]
    return Scenario("case", reqs, LIMITS)


def cfg(**kw) -> EngineConfig:
    return EngineConfig("vllm-cpu", "/m", 256, 4, **kw)


def facts(**kw) -> Facts:
    base = dict(prefix_on=False, chunks_prefill=True,
                sized_pool={"block_size": 16, "num_blocks_override": 65}, previous="spyre-1.10")
    return Facts(**{**base, **kw})


def by_factor(probes):
    out = {}
    for p in probes:
        out.setdefault(p.factor, []).append(p)
    return out


def test_every_factor_varies_one_condition_of_the_run() -> None:
    run = FailedRun(cfg(), scenario(100, 20), "generate", TOKEN_EQUALITY, "r1", teacher=Trace("x"))
    probes = by_factor(plan(run, facts()))
    assert [p.cfg for p in probes[REPEAT]] == [run.cfg] * 3
    assert all(s.teacher for p in probes[REPEAT] for s in p.steps)
    (alone,) = probes[BATCHING]
    (judge,) = alone.steps
    assert [r.request_id for r in judge.scenario.requests] == ["r1"]
    assert judge.scenario.requests[0].arrival_step == 0 and not judge.teacher
    (chunk,) = probes[CHUNKED]
    assert chunk.cfg.max_num_batched_tokens == 64 and "chunks of 64" in chunk.arms()[0]
    on, off = probes[PREFIX]
    assert (on.cfg.prefix_caching, off.cfg.prefix_caching) == (True, False)
    assert isinstance(on.steps[0], Warm) and isinstance(on.steps[1], Judge)
    (recycled,) = probes[RECYCLED]
    assert recycled.cfg.num_blocks_override == 65 and isinstance(recycled.steps[1], Cycle)
    assert recycled.arms() == ["fresh blocks", "recycled blocks"]
    (stack,) = probes[STACK]
    assert stack.cfg.stack == "spyre-1.10" and stack.arms() == ["on spyre-1.10"]


def test_a_chunked_run_is_tried_in_one_chunk() -> None:
    run = FailedRun(cfg(max_num_batched_tokens=64), scenario(100), "generate", TOKEN_EQUALITY, "r0")
    (chunk,) = by_factor(plan(run, facts()))[CHUNKED]
    assert chunk.cfg.max_num_batched_tokens == 256 and "one chunk of 256" in chunk.arms()[0]


def test_probes_not_made_say_why() -> None:
    run = FailedRun(cfg(), scenario(20), "run_steps", KV_LEDGER + ".conservation", "r0")
    probes = by_factor(plan(run, facts(chunks_prefill=False, previous=None,
                                       previous_missing="not installed")))
    assert "ran alone already" in probes[BATCHING][0].skip
    assert "prefills without chunks" in probes[CHUNKED][0].skip
    assert "prefix caching off" in probes[PREFIX][0].skip
    assert probes[STACK][0].skip == "not installed"


def test_forced_checks_keep_the_teacher_alone_and_only_the_prefix_arms_run_twice() -> None:
    run = FailedRun(cfg(), scenario(40, 40), "generate", FORCED_TOKENS, "r0", teacher=Trace("x"))
    probes = by_factor(plan(run, facts(prefix_on=True)))
    (judge,) = probes[BATCHING][0].steps
    assert judge.teacher
    for p in plan(run, facts(prefix_on=True)):
        assert len(p.steps) == {PREFIX: 2, RECYCLED: 3}.get(p.factor, 1), p
