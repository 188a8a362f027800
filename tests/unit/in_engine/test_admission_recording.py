"""What a step records for the admission checks: which requests ran prompt tokens."""

from __future__ import annotations

from types import SimpleNamespace

from harness.in_engine.process import prefill_ids, prompt_progress


def req(computed: int, prompt: int) -> SimpleNamespace:
    return SimpleNamespace(num_computed_tokens=computed, num_prompt_tokens=prompt)


def test_prompt_progress_reads_every_request_or_none():
    sched = SimpleNamespace(requests={"a": req(64, 64), "b": req(0, 30)})
    assert prompt_progress(sched) == {"a": (64, 64), "b": (0, 30)}
    assert prompt_progress(SimpleNamespace(requests={"a": SimpleNamespace()})) is None


def test_prefill_ids_are_the_scheduled_requests_whose_prompt_was_not_done():
    before = {"a": (65, 64), "b": (0, 30), "c": (128, 200)}
    assert prefill_ids(before, {"a": 1, "b": 30, "c": 72}) == ["b", "c"]
    assert prefill_ids(before, {"a": 1}) == []
    assert prefill_ids(before, None) == []
    assert prefill_ids(None, {"b": 30}) is None
