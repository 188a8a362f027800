"""Requests as the engine holds them, made into the trace's records (``harness.core.trace``).

A finished request comes from vLLM's final ``RequestOutput``; an aborted one from what the
engine held of it just before the abort (the scheduler's request and the output processor's
logprobs), since an aborted request gets no final output and its tokens would be lost.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from harness.core.trace import RequestTrace, TokenStep


def _token_steps(token_ids: Any, logprobs: Any) -> list[TokenStep]:
    """Each generated token with its top-k logprobs where ``logprobs`` (vLLM's per-position
    maps, a list or ``FlatLogprobs``) holds its position; NaN and no top-k where not."""
    steps = []
    for pos, tid in enumerate(token_ids):
        lp_map = logprobs[pos] if logprobs is not None and pos < len(logprobs) else {}
        top = {int(t): float(lp.logprob) for t, lp in (lp_map or {}).items()}
        steps.append(TokenStep(int(tid), top.get(int(tid), float("nan")), top))
    return steps


def request_trace(
    request_id: str, out: Any, fallback_prompt: list[int], num_preemptions: int = 0,
    max_tokens: int | None = None,
) -> RequestTrace:
    """A vLLM RequestOutput as a RequestTrace (tokens with top-k logprobs); ``max_tokens`` the
    request was sent with, where the caller records it."""
    comp = out.outputs[0]
    return RequestTrace(
        request_id=request_id,
        prompt_token_ids=list(out.prompt_token_ids or fallback_prompt),
        steps=_token_steps(comp.token_ids, comp.logprobs or None),
        num_preemptions=num_preemptions,
        finish_reason=comp.finish_reason,
        num_cached_tokens=int(getattr(out, "num_cached_tokens", 0) or 0),
        max_tokens=max_tokens,
    )


def prompt_progress(scheduler: Any) -> dict[str, tuple[int, int]] | None:
    """(tokens computed, prompt tokens) of every request ``scheduler`` has, by its engine id;
    None where its requests do not say."""
    out: dict[str, tuple[int, int]] = {}
    for rid, req in list(getattr(scheduler, "requests", {}).items()):
        computed = getattr(req, "num_computed_tokens", None)
        prompt = getattr(req, "num_prompt_tokens", None)
        if computed is None or prompt is None:
            return None
        out[str(rid)] = (int(computed), int(prompt))
    return out


def prefill_ids(before: dict[str, tuple[int, int]] | None, scheduled: Any) -> list[str] | None:
    """The engine ids among ``scheduled`` (a scheduler output's tokens per request) whose prompt
    was not all computed before the step (``before``, from ``prompt_progress``): this step ran
    their prompt tokens. None where ``before`` is unknown."""
    if before is None:
        return None
    return sorted(str(r) for r, n in dict(scheduled or {}).items()
                  if n and r in before and before[r][0] < before[r][1])


def _cache_hit(req: Any, state: Any) -> int:
    """The prompt tokens served to ``req`` from the prefix cache: the engine's request holds
    them where it has the field (vLLM 0.17: -1 until first scheduled); vLLM 0.28's has none,
    its output processor's request state keeps what the first output's prefill stats said."""
    hit = getattr(req, "num_cached_tokens", None)
    if hit is None:
        hit = getattr(state, "num_cached_tokens", 0)
    return max(0, int(hit or 0))


def aborted_traces(scheduler: Any, states: Any, aborted: Collection[str],
                   scenario_id: Callable[[str], str], step: int) -> dict[str, RequestTrace]:
    """The requests among ``aborted`` (scenario ids) as the engine holds them just before it
    aborts them at ``step``: the prompt, the output tokens they were given, the prompt tokens
    served from the prefix cache and their preemptions, by scenario id. ``scheduler`` is the
    engine core's, ``states`` its output processor's request states (their logprobs). Read
    before the abort, which drops them from both."""
    out: dict[str, RequestTrace] = {}
    for rid, req in list(getattr(scheduler, "requests", {}).items()):
        sid = scenario_id(str(rid))
        if sid not in aborted:
            continue
        state = (states or {}).get(rid)
        processor = getattr(state, "logprobs_processor", None)
        out[sid] = RequestTrace(
            request_id=sid,
            prompt_token_ids=[int(t) for t in req.prompt_token_ids or ()],
            steps=_token_steps(req.output_token_ids, getattr(processor, "logprobs", None)),
            num_preemptions=int(getattr(req, "num_preemptions", 0) or 0),
            finish_reason="abort",
            num_cached_tokens=_cache_hit(req, state),
            max_tokens=getattr(getattr(req, "sampling_params", None), "max_tokens", None),
            aborted_at=step,
        )
    return out
