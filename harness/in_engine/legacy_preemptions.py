"""Per-request and per-step preemption records on a vLLM that writes neither (vLLM 0.9).

vLLM 0.17 counts each request's preemptions (``Request.num_preemptions``) and lists the ids
it preempted in each ``SchedulerOutput.preempted_req_ids``. vLLM 0.9 (the legacy stack) has
neither field, so both signals would read as zero whatever happened. Its preemption path
still marks each preempted request ``RequestStatus.PREEMPTED``; this wrapper of the
scheduler's ``schedule`` finds, after each call, the requests that were running before it and
are PREEMPTED after it, and writes both fields the way vLLM 0.17 does (the ids on that step's
output, one more on the request's count). Runs inside the engine process.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


def recorded_schedule(sched: Any) -> Callable[..., Any]:
    """``sched.schedule``, or on a vLLM without ``preempted_req_ids`` a wrapper of it that
    records preemptions as described in the module docstring."""
    # deferred: a heavy import, paid only where this runs
    from vllm.v1.core.sched.output import SchedulerOutput

    original = sched.schedule
    if "preempted_req_ids" in {f.name for f in dataclasses.fields(SchedulerOutput)}:
        return original
    # deferred: a heavy import, paid only where this runs
    from vllm.v1.request import RequestStatus

    return recording(sched, original, RequestStatus.PREEMPTED)


def recording(sched: Any, original: Callable[..., Any], preempted_status: Any) -> Callable[..., Any]:
    """``original`` (the scheduler's schedule), writing the two preemption records."""

    def schedule(*a: Any, **kw: Any) -> Any:
        before = list(sched.running)
        out = original(*a, **kw)
        preempted = [r for r in before if r.status == preempted_status]
        for r in preempted:
            r.num_preemptions = getattr(r, "num_preemptions", 0) + 1
        out.preempted_req_ids = {r.request_id for r in preempted}
        return out

    return schedule
