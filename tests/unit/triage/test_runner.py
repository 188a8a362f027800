"""The triage runner on a fake pool and driver: fresh engines per probe, the filler that
cycles a pool, errors as rows, the budget, and the verdict from real judged traces."""

from __future__ import annotations

import math

from harness.checks.capacity import KvPool
from harness.checks.distribution import KL_FP32, DistributionPolicy
from harness.checks.logprobs import LogprobPolicy
from harness.core import triage as r
from harness.core.comparison import NearTiePolicy
from harness.core.config import EngineConfig
from harness.core.errors import EngineStartError
from harness.core.trace import RequestTrace, TokenStep, Trace
from harness.core.verdict import TOKEN_EQUALITY
from harness.scenario.prompts import EngineLimits, RequestSpec, Scenario
from harness.triage.budget import TriageBudget
from harness.triage.judge import Policies, triaged
from harness.triage.plan import Facts, FailedRun
from harness.triage.runner import MAX_FILLER, TriageRunner, filler

LIMITS = EngineLimits(256, 4)
SCENARIO = Scenario("case", [RequestSpec("r0", (1, 2, 3), 4), RequestSpec("r1", (4, 5), 4)],
                    LIMITS)
TOKENS = [10, 11, 12, 13]


def trace(label: str, bad: set[str]) -> Trace:
    reqs = {}
    for spec in SCENARIO.requests:
        toks = [t + (90 if spec.request_id in bad and i == 2 else 0) for i, t in enumerate(TOKENS)]
        steps = [TokenStep(t, math.log(0.9), {t: math.log(0.9), t + 1: math.log(0.05)}) for t in toks]
        reqs[spec.request_id] = RequestTrace(spec.request_id, list(spec.prompt_token_ids), steps)
    return Trace(label, reqs)


class FakePool:
    def __init__(self) -> None:
        self.discarded: list[str] = []

    def discard(self, key: str) -> None:
        self.discarded.append(key)


class FakeDriver:
    """Fails request r0 when ``fails(cfg, scenario, a filler ran on this engine)`` says so
    (a probe's engine is fresh: the calls since its configuration was last discarded)."""

    def __init__(self, fails) -> None:
        self.fails = fails
        self.calls: list[tuple[EngineConfig, str]] = []

    def generate(self, cfg, scenario, teacher=None) -> Trace:
        if cfg.stack == "broken":
            raise EngineStartError("engine spyre-1.10:vllm-cpu failed to start\nlog tail")
        cycled = any(c == cfg and name.endswith("filler") for c, name in self.calls)
        self.calls.append((cfg, scenario.name))
        bad = {"r0"} if self.fails(cfg, scenario, cycled) else set()
        t = trace(cfg.label, bad)
        t.requests = {k: v for k, v in t.requests.items()
                      if k in {q.request_id for q in scenario.requests}}
        return t

    def kv_pool(self, cfg) -> KvPool:
        return KvPool(num_blocks=33, block_size=16, pad_blocks=1, source="fake")


POLICIES = Policies(lambda label: NearTiePolicy(), lambda label: LogprobPolicy(0.01),
                    lambda label: DistributionPolicy(KL_FP32))
FACTS = Facts(prefix_on=False, chunks_prefill=True, sized_pool={}, previous="spyre-1.10")


def triage(fails, budget=None, facts=FACTS, cfg=None):
    cfg = cfg or EngineConfig("vllm-cpu", "/m", 256, 4)
    reference = trace("cpu-ref", set())
    run = FailedRun(cfg, SCENARIO, "generate", TOKEN_EQUALITY, "r0", reference=reference)
    pool, driver = FakePool(), FakeDriver(fails)
    runner = TriageRunner(pool, driver, POLICIES, budget or TriageBudget())
    return runner.triage("t::x", run, facts), pool, driver


def test_a_batching_bug_is_named_and_every_probe_had_a_fresh_engine() -> None:
    res, pool, driver = triage(lambda cfg, s, n: len(s.requests) > 1)
    assert (res.key, res.verdict) == (r.BATCHING, "depends on batching: fails only when decoded"
                                      " with another request")
    assert res.check == TOKEN_EQUALITY and res.nodeid == "t::x"
    # each probe's engine is stopped before (fresh) and after: 3 repeats, alone, prefix on
    # and off, recycled, previous stack (no prompt is long enough to chunk)
    assert len(pool.discarded) == 2 * 8
    assert [x.outcome for x in res.runs if x.factor == "chunked"] == [r.NOT_RUN]
    assert any(x.outcome == r.FAILED and "token mismatch" in x.why for x in res.runs)


def test_a_recycled_block_bug_fails_only_after_the_filler() -> None:
    res, _, _ = triage(lambda cfg, s, cycled: cycled and not s.name.endswith("filler"))
    assert res.key == r.RECYCLED, res.table()
    (fresh, recycled) = [x for x in res.runs if x.factor == "recycled"]
    assert (fresh.outcome, recycled.outcome) == (r.PASSED, r.FAILED)


def test_an_engine_that_refuses_a_condition_is_an_error_row() -> None:
    facts = Facts(prefix_on=False, chunks_prefill=True, sized_pool={}, previous="broken")
    res, _, _ = triage(lambda cfg, s, n: True, facts=facts)
    (stack,) = [x for x in res.runs if x.factor == "stack"]
    assert stack.outcome == r.ERROR and stack.why == "engine spyre-1.10:vllm-cpu failed to start"
    assert res.key == r.DETERMINISTIC


def test_the_budget_leaves_probes_not_run_and_the_next_test_untriaged() -> None:
    budget = TriageBudget(max_tests=1, seconds=1e-9)
    res, _, driver = triage(lambda cfg, s, n: True, budget=budget)
    assert not driver.calls
    assert all(x.outcome == r.NOT_RUN for x in res.runs)
    assert res.key == r.INCONCLUSIVE and "ran out" in res.note
    assert "first 1 failed" in budget.refusal()
    assert "off" in TriageBudget(enabled=False).refusal()


def test_the_filler_cycles_the_whole_pool_with_distinct_prompts() -> None:
    cfg = EngineConfig("vllm-cpu", "/m", 256, 4)
    s = filler(SCENARIO, cfg, KvPool(num_blocks=65, block_size=16, pad_blocks=1, source="x"))
    blocks = sum(math.ceil((len(q.prompt_token_ids) + 1) / 16) for q in s.requests)
    assert blocks >= 64 and all(q.max_tokens == 1 for q in s.requests)
    assert len({q.prompt_token_ids[0] for q in s.requests}) == len(s.requests)
    big = KvPool(num_blocks=16 * (MAX_FILLER + 1) * 16, block_size=16, pad_blocks=1, source="x")
    try:
        filler(SCENARIO, cfg, big)
    except Exception as e:
        assert "filler requests to cycle" in str(e)
    else:
        raise AssertionError("a pool too large to cycle was cycled")


def test_which_checks_are_triaged() -> None:
    assert triaged("token_equality") and triaged("kv_ledger.conservation")
    assert triaged("logprob_closeness.forced") and triaged("greedy_self_consistency")
    assert not triaged("kv_ledger.unrecorded") and not triaged("full_batch")
    assert not triaged("token_equality.negative_control") and not triaged("capacity")
