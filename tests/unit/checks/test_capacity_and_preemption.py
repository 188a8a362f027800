"""Pure checks: preflight block arithmetic, preemption signals, full-batch precondition,
dummy-block return; each shown to hold and to fail on a constructed trace."""

import math

import pytest

from harness.checks.capacity import (
    CapacityError,
    blocks_needed,
    check_pool_serves_full_batch,
    check_reservations_fill_pool,
    full_batch_shortfall,
    preflight,
    preflight_config,
)
from harness.checks.dummy_padding import check_dummy_padding
from harness.checks.ledger import check_dummy_returned
from harness.checks.preemption import (
    check_full_batch,
    check_no_preemption,
    check_preemption_seen,
    count_preemptions,
    largest_batch,
)
from harness.core.config import EngineConfig
from harness.core.trace import KvSnapshot, RequestTrace, StepRecord, Trace


def test_block_need_arithmetic():
    need = blocks_needed(256, 4, 16)
    assert (need.per_request, need.one_request, need.full_batch) == (16, 17, 65)
    # The Neuron geometry: one block per sequence, plus the null block.
    neuron = blocks_needed(256, 4, 256)
    assert (neuron.per_request, neuron.full_batch) == (1, 5)
    assert blocks_needed(250, 1, 64).per_request == 4  # partial blocks round up


def test_preflight_refuses_below_one_request_and_explains():
    need = blocks_needed(256, 4, 64)
    preflight(need, 5, "override")
    with pytest.raises(CapacityError, match=r"4 blocks \(override\) cannot serve one full-length request"):
        preflight(need, 4, "override")


def test_full_batch_shortfall_names_the_off_by_one():
    need = blocks_needed(256, 4, 256)
    assert full_batch_shortfall(need, 5) is None
    assert "4 x 1 + 1 = 5" in full_batch_shortfall(need, 4)


def test_preflight_config_refuses_a_pool_short_of_one_request():
    ok = EngineConfig(target="vllm-cpu", model="/m", max_model_len=256, max_num_seqs=2,
                      block_size=16, num_blocks_override=17)
    preflight_config(ok)
    with pytest.raises(CapacityError):
        preflight_config(ok.with_(num_blocks_override=16))


def test_pool_capacity_verdict_names_the_shortfall():
    need = blocks_needed(256, 4, 256)
    assert check_pool_serves_full_batch(need, 5).ok
    short = check_pool_serves_full_batch(need, 4)
    assert not short.ok and short.check == "capacity" and "4 x 1 + 1 = 5" in short.why
    none = check_pool_serves_full_batch(need, 1)
    assert "cannot serve one full-length request" in none.why


def step(n, running=(), waiting=(), preempted=(), kv=()):
    return StepRecord(step=n, running=list(running), waiting=list(waiting),
                      preempted=list(preempted), kv=list(kv))


def trace(steps, metric=0.0, per_request=None, executed=None):
    """Requests of a 3-token prompt and no output: each runs 2 tokens once (prompt + output - 1)."""
    t = Trace(target="t", steps=steps,
              metrics={} if metric is None else {"vllm:num_preemptions": metric})
    for rid, n in (per_request or {"r0": 0, "r1": 0}).items():
        t.requests[rid] = RequestTrace(request_id=rid, prompt_token_ids=[1, 2, 3], num_preemptions=n)
    if executed is not False:
        steps[0].executed = executed or {rid: 2 for rid in t.requests}
    return t


def test_full_batch_precondition():
    steps = [step(0, ["r0"], ["r1", "r2"]), step(1, ["r0", "r1", "r2"], ["r3"]), step(2, ["r3"])]
    assert largest_batch(steps) == (3, 1)
    verdict = check_full_batch(trace(steps), 4)
    assert not verdict.ok and verdict.check == "full_batch" and verdict.at == 1
    assert ("max_num_seqs=4 but the largest batch seen was 3 running requests (first at step 1)"
            in verdict.why)
    assert ">>" in verdict.details  # the per-step table marks the largest batch
    assert check_full_batch(trace(steps), 3).ok


def test_each_preemption_signal_alone_fails_the_check():
    clean = trace([step(0, ["r0", "r1"])])
    assert check_no_preemption(clean).ok
    by_metric = trace([step(0, ["r0", "r1"])], metric=1.0)
    by_request = trace([step(0, ["r0", "r1"])], per_request={"r0": 1, "r1": 0})
    by_step = trace([step(0, ["r0"], preempted=["r1"])])
    for t in (by_metric, by_request, by_step):
        verdict = check_no_preemption(t)
        assert not verdict.ok and verdict.check == "no_preemption"
        assert verdict.why.startswith("recompute:")
    assert "step 0: ['r1']" in check_no_preemption(by_step).why
    assert check_no_preemption(by_step).at == 0
    assert not count_preemptions(by_metric).all_signals_agree_preempted()
    assert not check_preemption_seen(by_metric).ok
    three = trace([step(3, ["r0"], preempted=["r1"])], metric=1.0, per_request={"r1": 1})
    assert not count_preemptions(three).all_signals_agree_preempted()  # no tokens run again
    assert "tokens run again per request (executor): none" in check_preemption_seen(three).why
    all_four = trace([step(3, ["r0"], preempted=["r1"])], metric=1.0, per_request={"r1": 1},
                     executed={"r0": 2, "r1": 2 + 3})
    assert count_preemptions(all_four).all_signals_agree_preempted()
    assert check_preemption_seen(all_four).ok


def test_an_aborted_requests_preemptions_are_counted_per_request():
    # r1 was preempted, then aborted: the trace keeps it apart (Trace.aborted), its count too
    t = trace([step(3, ["r0"], preempted=["r1"])], metric=1.0, per_request={"r1": 1},
              executed={"r0": 2, "r1": 2 + 3})
    gone = t.requests.pop("r1")
    gone.aborted_at = 4
    t.aborted = {"r1": gone}
    count = count_preemptions(t)
    assert count.per_request == {"r1": 1}
    assert "r1" not in (count.recomputed or {})  # an aborted request ran no whole output


def test_tokens_the_executor_ran_again_are_a_preemption_signal_of_their_own():
    # The scheduler's three signals all say nothing; the executor ran r1's 3 tokens twice.
    rerun = trace([step(0, ["r0", "r1"]), step(1, ["r1"])], executed={"r0": 2, "r1": 2})
    rerun.steps[1].executed = {"r1": 2}
    verdict = check_no_preemption(rerun)
    assert not verdict.ok and verdict.check == "no_preemption"
    assert "tokens run again per request (executor): {'r1': 2}" in verdict.why
    # Fewer tokens than the request has (a block or a step skipped) disagree too.
    short = trace([step(0, ["r0", "r1"])], executed={"r0": 2, "r1": 1})
    assert "{'r1': -1}" in check_no_preemption(short).why


def test_a_missing_signal_is_an_error_not_a_zero():
    for t, missing in ((trace([step(0, ["r0"])], metric=None), "vllm:num_preemptions counter"),
                       (trace([step(0, ["r0"])], executed=False), "tokens the executor ran")):
        for check in (check_no_preemption, check_preemption_seen):
            verdict = check(t)
            assert not verdict.ok and verdict.check == "no_preemption.unrecorded"
            assert missing in verdict.why and "not read as zero" in verdict.why


def snap(owned, free, dummy_ids=()):
    return KvSnapshot(source="spyre-legacy-runner", num_blocks=8, pad_blocks=[], free_blocks=free,
                      owned=owned, dummy_ids=list(dummy_ids), reserved=None,
                      reported_free=None, tkv=None)


def test_dummy_blocks_must_be_back_when_a_second_request_joins():
    alone = step(3, ["r0"], kv=[snap({"r0": [0], "dummy": [1]}, [2, 3, 4, 5, 6, 7], ["dummy"])])
    joined_ok = step(4, ["r0", "r1"], kv=[snap({"r0": [0], "r1": [2]}, [1, 3, 4, 5, 6, 7])])
    joined_leak = step(4, ["r0", "r1"], kv=[snap({"r0": [0], "r1": [2], "dummy": [1]},
                                                  [3, 4, 5, 6, 7], ["dummy"])])
    empty_leak = step(9, [], kv=[snap({"dummy": [1]}, [0, 2, 3, 4, 5, 6, 7], ["dummy"])])
    # The last request finishing: the runner hears of it (and returns the dummy) next step.
    last_finishes = step(8, [], kv=[snap({"r0": [0], "dummy": [1]}, [2, 3, 4, 5, 6, 7], ["dummy"])])
    last_finishes.finished = ["r0"]
    idle = step(9, [], kv=[snap({}, [0, 1, 2, 3, 4, 5, 6, 7])])
    assert check_dummy_returned([alone, joined_ok, last_finishes]) == []
    (v,) = check_dummy_returned([alone, joined_leak])
    assert (v.invariant, v.step) == ("dummy_returned", 4)
    assert "dummy 'dummy' still holds blocks [1] although 2 real requests run" in v.message
    (v,) = check_dummy_returned([empty_leak])
    assert "the batch is empty" in v.message
    # The suite's verdict: taken while alone, returned when r1 joins and at the end.
    assert check_dummy_padding(trace([alone, joined_ok, last_finishes, idle])).ok
    kept = check_dummy_padding(trace([alone, joined_leak, idle]))
    assert not kept.ok and kept.check == "dummy_padding" and kept.at == 4
    assert "dummy still holds [1] at step 4" in kept.why
    never = check_dummy_padding(trace([step(3, ["r0"], kv=[snap({"r0": [0]}, [1, 2])]),
                                       joined_ok]))
    assert never.ok and never.why == "no dummy"


def test_a_stack_that_declares_dummy_padding_fails_without_a_dummy():
    from harness.targets import kind

    spyre = kind("spyre")
    pads_decode_batch, dummy_padding_verdict = spyre.pads_decode_batch, spyre.dummy_padding_verdict
    alone = step(3, ["r0"], kv=[snap({"r0": [0], "dummy": [1]}, [2, 3, 4, 5, 6, 7], ["dummy"])])
    joined = step(4, ["r0", "r1"], kv=[snap({"r0": [0], "r1": [2]}, [1, 3, 4, 5, 6, 7])])
    # The adapter lists the dummy under an id it does not know as a dummy: no dummy is seen.
    unseen = step(3, ["r0"], kv=[snap({"r0": [0], "padding": [1]}, [2, 3, 4, 5, 6, 7])])
    legacy, default = "legacy-spyre-0.4", "default"
    assert pads_decode_batch(legacy, "spyre-eager-cb") and not pads_decode_batch(default, "spyre-eager-cb")
    assert dummy_padding_verdict(trace([alone, joined]), legacy, "spyre-eager-cb").ok
    broken = dummy_padding_verdict(trace([unseen, joined]), legacy, "spyre-eager-cb")
    assert not broken.ok and broken.check == "dummy_padding"
    assert "declares that spyre-eager-cb pads" in broken.why and "no dummy held" in broken.why
    # Nothing declared, nothing seen: nothing to check (the suite skips).
    assert dummy_padding_verdict(trace([unseen, joined]), default, "spyre-eager-cb") is None
    surprise = dummy_padding_verdict(trace([alone, joined]), default, "spyre-eager-cb")
    assert not surprise.ok and "does not declare dummy padding" in surprise.why
    assert "declare it in harness/targets/spyre/padding.py" in surprise.why
    # A kind that declares no padding: a dummy on it fails, naming where a kind declares it.
    cpu = kind("vllm-cpu").dummy_padding_verdict(trace([alone, joined]), default, "vllm-cpu")
    assert not cpu.ok and "declare it in harness/targets/vllm_cpu/kind.py" in cpu.why
    assert kind("vllm-cpu").dummy_padding_verdict(trace([unseen, joined]), default, "vllm-cpu") is None


@pytest.mark.parametrize("prompt_len", [1, 63, 64, 65, 200])
def test_full_batch_requests_on_vllm_cpu_use_every_block_of_their_share(prompt_len):
    # vLLM holds KV for prompt + output - 1 tokens (the last token is never fed back), so a
    # request filling max_model_len holds exactly the formula's per-request blocks.
    from harness.targets import kind

    max_tokens = kind("vllm-cpu").full_length_max_tokens(256, prompt_len)
    need = blocks_needed(256, 4, 16)
    assert math.ceil((prompt_len + max_tokens - 1) / 16) == need.per_request
    assert prompt_len + max_tokens == 256


def test_spyre_full_batch_requests_keep_one_block_of_tkv_headroom():
    from harness.targets import kind

    for prompt_len in (63, 64, 65):
        padded = math.ceil(prompt_len / 64) * 64  # the prompt padded to Spyre's 64-token block
        assert padded + kind("spyre").full_length_max_tokens(256, prompt_len) + 64 == 256


def test_executed_tokens_are_counted_per_step_at_the_executor():
    from types import SimpleNamespace

    from harness.in_engine.executed import ExecutedTokens

    calls = []
    executor = SimpleNamespace(execute_model=lambda so, non_block=False: calls.append(so) or "out")
    counter = ExecutedTokens(executor)
    step = SimpleNamespace(num_scheduled_tokens={"a": 64, "b": 1})
    assert executor.execute_model(step, non_block=True) == "out" and calls == [step]
    executor.execute_model(SimpleNamespace(num_scheduled_tokens={"b": 1}))
    assert counter.take() == {"a": 64, "b": 2}
    assert counter.take() == {}  # each step starts afresh


def _filled_trace(reported_free: int, running: int = 2) -> Trace:
    runner = KvSnapshot(source="spyre-runner", num_blocks=8, pad_blocks=[0], reported_free=3,
                        owned={"r0": [1]})
    full = KvSnapshot(source="spyre-runner", num_blocks=8, pad_blocks=[0],
                      reported_free=reported_free, owned={"r0": [1], "r1": [2]})
    ids = [f"r{i}" for i in range(running)]
    return Trace(target="t", steps=[StepRecord(step=0, running=["r0"], kv=[runner]),
                                    StepRecord(step=1, running=ids, kv=[full])])


def test_reservations_fill_pool_fails_when_a_block_is_left_over():
    assert check_reservations_fill_pool(_filled_trace(0), 2).ok
    slack = check_reservations_fill_pool(_filled_trace(1), 2)
    assert not slack.ok and slack.check == "capacity.filled"
    assert "left 1 of the pool's blocks unreserved" in slack.why
    never = check_reservations_fill_pool(_filled_trace(0, running=1), 2)
    assert not never.ok and "no step ran 2 requests at once" in never.why
