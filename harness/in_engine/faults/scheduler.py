"""Faults in vLLM's scheduling of requests: its preemptions, what it reports of them, and
when it frees a finished or aborted request's blocks.

A preemption made unrecorded, one forced where the pool would never run out by itself,
the vllm:num_preemptions counter missing from the engine's metrics, a finished request's
blocks freed one engine step late, and an aborted request's blocks never freed.
"""

from __future__ import annotations

from typing import Any

from harness.in_engine.fault_registry import (
    RUNNER_PREEMPTION,
    Once,
    armed,
    fault,
    run_target_hook,
)


@fault("silent-preemption")
def silent_preemption(config: dict[str, Any]) -> None:
    """vLLM's scheduler preempts and recomputes as usual, but its preemption bookkeeping
    says nothing: no PREEMPTED event (the vllm:num_preemptions counter stays), the
    request's num_preemptions is put back, and the step's preempted ids are emptied."""
    from vllm.v1.core.sched.scheduler import Scheduler  # defers a heavy import

    preempt, schedule = Scheduler._preempt_request, Scheduler.schedule

    def _preempt_request(self: Any, request: Any, *a: Any, **kw: Any) -> Any:
        log_stats, self.log_stats = self.log_stats, False
        try:
            out = preempt(self, request, *a, **kw)
        finally:
            self.log_stats = log_stats
        request.num_preemptions -= 1
        print(f"[hil] fault silent_preemption fired: {request.request_id} preempted unrecorded",
              flush=True)
        return out

    def quiet_schedule(self: Any, *a: Any, **kw: Any) -> Any:
        out = schedule(self, *a, **kw)
        if getattr(out, "preempted_req_ids", None):
            out.preempted_req_ids = set()
        return out

    Scheduler._preempt_request = _preempt_request  # type: ignore[method-assign]
    Scheduler.schedule = quiet_schedule  # type: ignore[method-assign]


@fault("preempt-running-once")
def preempt_running_once(config: dict[str, Any], after: str = "2") -> None:
    """Once, vLLM's KV cache manager refuses the blocks a running request asks for at a
    decode step (the ``after``-th such request after start, 0-based), as a full pool would.
    Nothing else is touched: vLLM's own scheduler then preempts through its preemption
    path (frees the request, counts it, lists it as preempted) and resumes it later, asking
    the executor to run its prompt and output again. A negative control for targets whose
    pool never runs out by itself (vllm-spyre's stand-in block is max_model_len long).
    A runner without a preemption path gets one from its kind's target hook
    (``RUNNER_PREEMPTION``; vllm-spyre's drops the preempted request and prefills it again).
    """
    from vllm.v1.core.kv_cache_manager import KVCacheManager  # defers a heavy import
    from vllm.v1.request import RequestStatus  # defers a heavy import

    original = KVCacheManager.allocate_slots
    once = Once(after)

    def allocate_slots(self: Any, request: Any, *a: Any, **kw: Any) -> Any:
        decoding = (request.status == RequestStatus.RUNNING
                    and request.num_computed_tokens >= request.num_prompt_tokens)
        if decoding and once.due():
            once.fire(f"[hil] fault preempt_running_once fired: no blocks for"
                      f" {request.request_id} at {request.num_computed_tokens} tokens")
            return None
        return original(self, request, *a, **kw)

    KVCacheManager.allocate_slots = allocate_slots  # type: ignore[method-assign]
    run_target_hook(RUNNER_PREEMPTION, config)


@fault("hide-preemption-counter")
def hide_preemption_counter(config: dict[str, Any]) -> None:
    """The engine's metrics lack the vllm:num_preemptions counter (a stack that does not
    export it, or stats turned off), so it must not read as zero preemptions."""
    from vllm import LLM  # defers a heavy import

    original = LLM.get_metrics

    def get_metrics(self: Any, *a: Any, **kw: Any) -> Any:
        return [m for m in original(self, *a, **kw) if m.name != "vllm:num_preemptions"]

    LLM.get_metrics = get_metrics  # type: ignore[method-assign]


@fault("free-late")
def free_late(config: dict[str, Any]) -> None:
    """vLLM's scheduler frees a finished request's blocks one engine step late: its KV cache
    manager keeps them (still owned, so conservation holds) until the scheduler's next
    ``schedule`` call, which frees them before it schedules anything (admission sees the
    same free blocks as without the fault, and nothing is left at idle). Preemptions free
    at once; every finish is late once armed, the log line is printed once."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager  # defers a heavy import
    from vllm.v1.core.sched.scheduler import Scheduler  # defers a heavy import

    free, init = KVCacheManager.free, Scheduler.__init__
    late: dict[int, list[Any]] = {}  # id(KV cache manager) -> finished requests not freed yet
    said = Once()

    def free_later(self: Any, request: Any) -> None:
        if not (armed() and request.is_finished()):
            return free(self, request)
        late.setdefault(id(self), []).append(request)
        if said.due():
            said.fire(f"[hil] fault free_late fired: {request.request_id}'s blocks freed one"
                      " step late")
        return None

    def __init__(self: Any, *a: Any, **kw: Any) -> None:
        init(self, *a, **kw)
        schedule = self.schedule  # the engine's own scheduler class's

        def schedule_after_late_frees(*sa: Any, **skw: Any) -> Any:
            manager = self.kv_cache_manager
            for request in late.pop(id(manager), []):
                free(manager, request)
            return schedule(*sa, **skw)

        self.schedule = schedule_after_late_frees

    KVCacheManager.free = free_later  # type: ignore[method-assign]
    Scheduler.__init__ = __init__  # type: ignore[method-assign]


@fault("abort-keeps-blocks")
def abort_keeps_blocks(config: dict[str, Any]) -> None:
    """vLLM's KV cache manager does not free the blocks of a request aborted by its client
    (status FINISHED_ABORTED, the path ``LLMEngine.abort_request`` takes): they stay owned
    by a request the scheduler no longer has, for the life of the engine. Requests that
    finish by themselves free as usual; the log line is printed once."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager  # defers a heavy import
    from vllm.v1.request import RequestStatus  # defers a heavy import

    free = KVCacheManager.free
    said = Once()

    def free_unless_aborted(self: Any, request: Any) -> None:
        if armed() and request.status == RequestStatus.FINISHED_ABORTED:
            if said.due():
                said.fire(f"[hil] fault abort_keeps_blocks fired: {request.request_id}'s"
                          " blocks kept after its abort")
            return None
        return free(self, request)

    KVCacheManager.free = free_unless_aborted  # type: ignore[method-assign]
