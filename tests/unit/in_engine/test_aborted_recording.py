"""An aborted request as the engine held it just before the abort
(harness/in_engine/requests.py): its prompt, output tokens, logprobs and cache hit."""

from __future__ import annotations

import math
from types import SimpleNamespace

from harness.in_engine.requests import aborted_traces


def test_an_aborted_request_keeps_the_tokens_it_was_given():
    sampled = [{7: SimpleNamespace(logprob=-0.1), 8: SimpleNamespace(logprob=-2.0)}]
    scheduler = SimpleNamespace(requests={
        "r0-abc": SimpleNamespace(prompt_token_ids=[1, 2, 3], output_token_ids=[7, 9],
                                  num_preemptions=1, num_cached_tokens=0,
                                  sampling_params=SimpleNamespace(max_tokens=20)),
        "r1-def": SimpleNamespace(prompt_token_ids=[4], output_token_ids=[5]),
    })
    states = {"r0-abc": SimpleNamespace(logprobs_processor=SimpleNamespace(logprobs=sampled))}
    got = aborted_traces(scheduler, states, {"r0"}, lambda rid: rid.split("-")[0], 11)
    assert list(got) == ["r0"]
    r0 = got["r0"]
    assert (r0.prompt_token_ids, r0.token_ids, r0.aborted_at) == ([1, 2, 3], [7, 9], 11)
    assert (r0.num_preemptions, r0.max_tokens, r0.finish_reason) == (1, 20, "abort")
    assert r0.steps[0].logprob == -0.1 and r0.steps[0].top_logprobs == {7: -0.1, 8: -2.0}
    assert math.isnan(r0.steps[1].logprob) and r0.steps[1].top_logprobs == {}


def test_a_request_not_yet_scheduled_reports_no_cache_hit():
    # vLLM's num_cached_tokens is -1 until the scheduler first schedules the request
    scheduler = SimpleNamespace(requests={"r0": SimpleNamespace(
        prompt_token_ids=[1], output_token_ids=[], num_cached_tokens=-1)})
    got = aborted_traces(scheduler, None, {"r0"}, str, 0)
    assert got["r0"].num_cached_tokens == 0 and got["r0"].steps == []


def test_the_cache_hit_comes_from_the_output_state_where_the_request_has_no_field():
    # vLLM 0.28: Request has no num_cached_tokens; the first output's prefill stats put the
    # hit into the output processor's request state
    scheduler = SimpleNamespace(requests={"r0": SimpleNamespace(
        prompt_token_ids=[1] * 203, output_token_ids=[5, 6])})
    states = {"r0": SimpleNamespace(num_cached_tokens=64, logprobs_processor=None)}
    got = aborted_traces(scheduler, states, {"r0"}, str, 20)
    assert got["r0"].num_cached_tokens == 64
