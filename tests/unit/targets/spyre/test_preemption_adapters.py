"""The two adapters the spyre negative control for preemption relies on, on fake inputs:
the runner's view of a preemption (harness.targets.spyre.resume) and the per-request and
per-step records on a vLLM that writes neither (harness.in_engine.legacy_preemptions)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from harness.in_engine.legacy_preemptions import recording
from harness.targets.spyre.resume import _rebuild


@dataclass
class NewReq:
    req_id: str
    prompt_token_ids: list[int]
    sampling_params: Any
    block_ids: Any
    num_computed_tokens: int = 0


@dataclass
class Cached:  # vLLM 0.17's CachedRequestData, the fields the adapter touches
    req_ids: list[str]
    resumed_req_ids: set[str]
    new_token_ids: list[list[int]]
    all_token_ids: dict[str, list[int]]
    new_block_ids: list[Any]
    num_computed_tokens: list[int]
    num_output_tokens: list[int]


@dataclass
class LegacyCached:  # vLLM 0.9's CachedRequestData
    req_id: str
    resumed_from_preemption: bool
    new_token_ids: list[int]
    new_block_ids: list[list[int]]
    num_computed_tokens: int


@dataclass
class Out:
    scheduled_new_reqs: list[Any]
    scheduled_cached_reqs: Any
    finished_req_ids: set[str] = field(default_factory=set)
    preempted_req_ids: set[str] = field(default_factory=set)


def first_prefill() -> dict[str, NewReq]:
    return {"r0": NewReq("r0", [1, 2, 3], SimpleNamespace(max_tokens=10), ([0],))}


def test_nothing_preempted_leaves_the_output_alone():
    so = Out([], Cached(["r0"], set(), [], {}, [None], [4], [1]))
    assert _rebuild(so, first_prefill()) is so


def test_a_preempted_request_leaves_the_runner_as_finished():
    so = Out([], Cached([], set(), [], {}, [], [], []), {"r9"}, {"r0"})
    seen = _rebuild(so, first_prefill())
    assert seen.finished_req_ids == {"r9", "r0"}
    assert so.finished_req_ids == {"r9"}, "vLLM's own output must stay as vLLM wrote it"


def test_a_resumed_request_is_prefilled_with_its_tokens_so_far():
    so = Out([], Cached(["r1", "r0"], {"r0"}, [], {"r0": [1, 2, 3, 7, 8]}, [None, ([5],)],
                        [6, 0], [3, 2]))
    seen = _rebuild(so, first_prefill())
    (new,) = seen.scheduled_new_reqs
    assert (new.req_id, new.prompt_token_ids, new.block_ids) == ("r0", [1, 2, 3, 7, 8], ([5],))
    assert new.sampling_params.max_tokens == 8  # two of its ten tokens are already generated
    assert first_prefill()["r0"].sampling_params.max_tokens == 10
    assert seen.scheduled_cached_reqs.req_ids == ["r1"]
    assert seen.scheduled_cached_reqs.num_computed_tokens == [6]
    assert so.scheduled_cached_reqs.req_ids == ["r1", "r0"]


def test_a_resumed_request_on_vllm_0_9_is_prefilled_with_its_tokens_so_far():
    cached = [LegacyCached("r1", False, [9], [], 6),
              LegacyCached("r0", True, [1, 2, 3, 7], [[4]], 0)]
    seen = _rebuild(Out([], cached), first_prefill())
    (new,) = seen.scheduled_new_reqs
    assert (new.prompt_token_ids, new.block_ids) == ([1, 2, 3, 7], [[4]])
    assert new.sampling_params.max_tokens == 9
    assert [c.req_id for c in seen.scheduled_cached_reqs] == ["r1"]


def test_vllm_0_9_preemptions_are_recorded_per_request_and_per_step():
    a = SimpleNamespace(request_id="a", status="RUNNING")
    b = SimpleNamespace(request_id="b", status="RUNNING")
    sched = SimpleNamespace(running=[a, b])

    def schedule() -> Any:  # the scheduler preempts b, as vLLM 0.9's preemption path does
        sched.running = [a]
        b.status = "PREEMPTED"
        return SimpleNamespace()

    out = recording(sched, schedule, "PREEMPTED")()
    assert out.preempted_req_ids == {"b"}
    assert b.num_preemptions == 1 and not hasattr(a, "num_preemptions")

    quiet = recording(sched, lambda: SimpleNamespace(), "PREEMPTED")()
    assert quiet.preempted_req_ids == set(), "a step without preemption lists none"
