"""Let vllm-spyre's continuous-batching runner take part in a vLLM preemption.

vllm-spyre never expects vLLM to preempt (its scheduler's stand-in block is max_model_len
long), so its runner has no preemption path: it keeps a preempted request in its batch and
fails the next decode step that leaves it out. ``handle_preemption_in_runner`` gives it the
narrowest one, built from what the runner already does: the scheduler output the runner sees
lists each preempted request among the finished ones (the runner frees its blocks and drops
it), and a request vLLM resumes is handed over as a new request whose prompt is its prompt
plus the tokens generated so far, with that many fewer tokens still to generate (the runner
prefills, really recomputing them). vLLM's own scheduler output is not changed: the harness
records it as vLLM wrote it. Runs inside the engine process.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any


def _resumed_as_new(first: Any, tokens: list[int], block_ids: Any) -> Any:
    """The NewRequestData of a resumed request: prompt plus tokens so far, as a prompt."""
    params = copy.copy(first.sampling_params)
    params.max_tokens = first.sampling_params.max_tokens - (len(tokens)
                                                            - len(first.prompt_token_ids))
    print(f"[hil] runner resumes {first.req_id}: prefills {len(tokens)} tokens again",
          flush=True)
    return dataclasses.replace(first, prompt_token_ids=tokens, sampling_params=params,
                               block_ids=block_ids, num_computed_tokens=0)


def _rebuild(so: Any, seen: dict[str, Any]) -> Any:
    """The scheduler output as the runner must see it (``so`` itself when nothing changes)."""
    preempted = set(getattr(so, "preempted_req_ids", None) or ())
    cached = so.scheduled_cached_reqs
    if isinstance(cached, list):  # vLLM 0.9: one CachedRequestData per request
        resumed = {c.req_id for c in cached if c.resumed_from_preemption}
    else:
        resumed = set(getattr(cached, "resumed_req_ids", None) or ())
    if not preempted and not resumed:
        return so
    out = copy.copy(so)
    out.finished_req_ids = set(so.finished_req_ids) | preempted
    if isinstance(cached, list):
        # A resumed request's new_token_ids are all its tokens (it has none computed).
        out.scheduled_new_reqs = list(so.scheduled_new_reqs) + [
            _resumed_as_new(seen[c.req_id], list(c.new_token_ids), c.new_block_ids)
            for c in cached if c.req_id in resumed]
        out.scheduled_cached_reqs = [c for c in cached if c.req_id not in resumed]
        return out
    keep = [i for i, rid in enumerate(cached.req_ids) if rid not in resumed]
    out.scheduled_new_reqs = list(so.scheduled_new_reqs) + [
        _resumed_as_new(seen[rid], list(cached.all_token_ids[rid]), cached.new_block_ids[i])
        for i, rid in enumerate(cached.req_ids) if rid in resumed]
    out.scheduled_cached_reqs = dataclasses.replace(
        cached,
        req_ids=[cached.req_ids[i] for i in keep],
        resumed_req_ids=set(),
        new_token_ids=[cached.new_token_ids[i] for i in keep] if cached.new_token_ids else [],
        all_token_ids={r: t for r, t in cached.all_token_ids.items() if r not in resumed},
        new_block_ids=[cached.new_block_ids[i] for i in keep],
        num_computed_tokens=[cached.num_computed_tokens[i] for i in keep],
        num_output_tokens=[cached.num_output_tokens[i] for i in keep],
    )
    return out


def handle_preemption_in_runner(runner_cls: Any) -> None:
    """Patch ``runner_cls.execute_model`` (vllm-spyre's continuous-batching runner, 1.x or
    0.4) as described in the module docstring. The preempted ids come from the scheduler
    output (on vLLM 0.9, from harness.in_engine.legacy_preemptions)."""
    original = runner_cls.execute_model
    seen: dict[str, Any] = {}  # request id -> the NewRequestData of its first prefill

    def execute_model(self: Any, scheduler_output: Any, *a: Any, **kw: Any) -> Any:
        for nr in scheduler_output.scheduled_new_reqs:
            seen.setdefault(nr.req_id, nr)
        return original(self, _rebuild(scheduler_output, seen), *a, **kw)

    runner_cls.execute_model = execute_model
