"""Prefix caching served again: pure checks of a step-driven Trace.

A prompt served again (the same prompt, or one sharing a prefix with a request that computed
it earlier in the run) must report its cached tokens, run only the rest of its prompt, and
take from the cache exactly what the stack's alignment allows. The rules, read in vLLM 0.28
and sendnn-inference 2.6.3 and computed here from the trace's own numbers:

- **Reported cached tokens** (``RequestTrace.num_cached_tokens``, vLLM's): whole blocks. A
  block is a hit when every token of it, and of every block before it, equals a block an
  earlier request of the run had computed by the time this one started: its prompt, and the
  output tokens it had run, an aborted or preempted request's included (``Trace.ran``, counted
  from the executed tokens per step by ``harness.checks.computed``); the prompt's last token
  is always computed, so at most ``(prompt_len - 1) // block_size`` blocks. vLLM caches a
  block when it schedules its tokens, so a request scheduled before this one in the same step
  counts with that step's tokens. Without prefix caching, nothing is cached; a request that
  shares no prefix with an earlier one is served nothing from the cache. (sendnn-inference's
  scheduler is vLLM's here: it reports the same block hit.)
- **Executed prompt tokens** (``StepRecord.executed``: the tokens the executor was handed per
  request, by vLLM's scheduler, at the steps that ran its prompt, ``StepRecord.prefilled``):
  ``prompt_len - cached``, none run again.
- **What the runner takes from the cache** (sendnn-inference 2.x, recorded per request from
  its runner as ``KvSnapshot.runner_cached``): the runner computes a prompt in whole chunks,
  the first one left-padded with whole blocks so the prompt ends a chunk
  (``pad = chunks * chunk - ceil(prompt_len / block_size) * block_size``). A chunk is served
  from the cache only when all of it, its left padding included, is a hit, and the prompt's
  last chunk is always computed: it takes ``min((pad + cached) // chunk, chunks - 1) * chunk
  - pad`` tokens (at least 0), and runs one prefill step for each chunk it does not take. A
  hit inside a chunk is computed again in that chunk (the runner writes those blocks to the
  pad block, not over the cached ones), so the runner recomputes ``cached - taken`` tokens
  the scheduler reported as cached.

The expected hit assumes nothing the run computed was evicted, and that the engine held no
block of these prompts from an earlier run: a test gives prompts of its own and a pool that
holds the run, which is why these checks are called by the prefix-reuse suite and not on
every ledger.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from harness.checks.computed import ComputedTokens, scheduler_pool
from harness.core.trace import KvSnapshot, Trace
from harness.core.verdict import FULL_BATCH, KV_LEDGER, KV_LEDGER_UNRECORDED, Verdict
from harness.render.ledger_table import format_step_table

PREFIX_REUSE = f"{KV_LEDGER}.prefix_reuse"
# The precondition's check, filed with the full-batch precondition: the run never served a
# prompt from the cache, so it proves nothing about serving one.
PREFIX_SERVED = f"{FULL_BATCH}.prefix_served"
MAX_LISTED = 20


def shared_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` have in common."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def block_hit(shared: int, prompt_len: int, block_size: int) -> int:
    """vLLM's prefix-cache hit in tokens for a prompt of ``prompt_len`` tokens whose first
    ``shared`` tokens an earlier request computed: whole blocks, never the last token."""
    return min(shared // block_size, (prompt_len - 1) // block_size) * block_size


def chunk_aligned(cached: int, prompt_len: int, chunk: int, block_size: int) -> tuple[int, int]:
    """(tokens the chunked-prefill runner takes from the cache, chunks it computes) for a
    prompt of ``prompt_len`` tokens with a block hit of ``cached`` tokens (see the module's
    rule: whole chunks including the left padding, never the last chunk)."""
    chunks = math.ceil(prompt_len / chunk)
    pad = chunks * chunk - math.ceil(prompt_len / block_size) * block_size
    served = min((pad + cached) // chunk, chunks - 1)
    return max(0, served * chunk - pad), chunks - served


@dataclass
class Served:
    """What the trace says about one request's prompt: when it started, the tokens the
    executor ran for it and in how many steps, the earlier request it shares most with."""

    request_id: str
    prompt_len: int
    reported: int
    start: int | None = None
    executed: int = 0
    steps: list[int] | None = None
    sharer: str | None = None
    shared: int = 0
    expected: int = 0
    runner: int | None = None


def _serving(trace: Trace, prompts: Mapping[str, Sequence[int]] | None = None
             ) -> dict[str, Served]:
    """Each request's prompt as the run served it (the finished ones and the aborted ones,
    ``Trace.ran``), with its best earlier sharer. An earlier request shares the tokens of its
    prompt and output whose KV it had computed by then (``computed_tokens``). ``prompts`` gives
    the prompts of requests the trace holds nothing of (a trace recorded without its aborted
    requests), which computed blocks others can be served."""
    ran = trace.ran()
    seqs = {r: list(p) for r, p in (prompts or {}).items() if r not in ran}
    seqs.update({r: [*t.prompt_token_ids, *t.token_ids] for r, t in ran.items()})
    out = {r: Served(r, len(t.prompt_token_ids), t.num_cached_tokens, steps=[])
           for r, t in ran.items()}
    computed = ComputedTokens.of(trace)
    for record in trace.steps:
        computed.preempted(record.preempted)
        for r, n in record.executed.items():
            s = out.get(r)
            if s is not None and s.start is None:
                s.start = record.step
                for e, c in computed.high.items():
                    if e == r or e not in seqs:
                        continue
                    shared = shared_prefix(list(ran[r].prompt_token_ids), seqs[e][:c])
                    if shared > s.shared:
                        s.sharer, s.shared = e, shared
            # the engine's own record of the prompts the step ran, where the step has one
            prefill = (r in record.prefilled if record.prefilled is not None
                       else computed.high.get(r, 0) < (s.prompt_len if s is not None else 0))
            if s is not None and prefill:
                s.executed += n
                assert s.steps is not None
                s.steps.append(record.step)
            computed.ran(r, n)  # scheduled now: cached for those after it
    for s in out.values():
        for k in trace.ledger_steps():
            cached = next((v.runner_cached[s.request_id] for v in k.kv
                           if v.runner_cached and s.request_id in v.runner_cached), None)
            if cached is not None:
                s.runner = cached
                break
    return out


def _pool(trace: Trace) -> KvSnapshot | None:
    """The scheduler's pool snapshot: its block size, whether prefix caching is on, the chunk."""
    return scheduler_pool(trace)


def _judge(s: Served, block_size: int, chunk: int | None) -> list[str]:
    """What is wrong with request ``s``'s prompt service (empty: as the rules give)."""
    out: list[str] = []
    ran = s.prompt_len - s.reported
    blocks = f"{s.expected} in whole {block_size}-token blocks before its last token"
    if s.sharer is None and s.reported:
        out.append(f"request {s.request_id} reports {s.reported} cached tokens but shares no"
                   " prefix with an earlier request of the run: nothing it computed could"
                   " serve them")
    elif s.sharer is not None and s.reported != s.expected:
        if s.executed == s.prompt_len - s.expected:  # it ran only the rest of what it shared
            out.append(f"request {s.request_id} reports {s.reported} cached tokens but was"
                       f" served {s.expected} from the cache: it ran only {s.executed} of its"
                       f" {s.prompt_len} prompt tokens")
        elif s.reported < s.expected:
            out.append(f"request {s.request_id} was served {s.reported} cached tokens where it"
                       f" shares {s.shared} tokens with request {s.sharer} ({blocks}): it"
                       f" computed {s.expected - s.reported} tokens the cache held")
        else:
            out.append(f"request {s.request_id} reports {s.reported} cached tokens but shares"
                       f" only {s.shared} with request {s.sharer} ({blocks})")
    elif s.executed != ran:
        out.append(f"request {s.request_id} ran {s.executed} prompt tokens, but its prompt of"
                   f" {s.prompt_len} less the {s.reported} cached leaves {ran}")
    if s.runner is not None and chunk:
        taken, chunks = chunk_aligned(s.reported, s.prompt_len, chunk, block_size)
        if s.runner != taken:
            out.append(f"request {s.request_id}'s runner takes {s.runner} prompt tokens from the"
                       f" cache, but {s.reported} cached in {chunk}-token chunks allow {taken}")
        elif s.steps is not None and len(s.steps) != chunks:
            out.append(f"request {s.request_id} ran its prompt in {len(s.steps)} prefill steps,"
                       f" but with {taken} tokens from the cache its runner computes {chunks}"
                       f" {chunk}-token chunks")
    return out


def _line(s: Served) -> str:
    sharer = "no earlier request" if s.sharer is None else f"{s.shared} with {s.sharer}"
    runner = "" if s.runner is None else f", its runner takes {s.runner}"
    return (f"  {s.request_id}: prompt {s.prompt_len}, started at step"
            f" {'-' if s.start is None else s.start}, shares {sharer}; cached {s.reported}"
            f" (expected {s.expected}), ran {s.executed} prompt tokens in"
            f" {len(s.steps or [])} steps{runner}")


def check_prefix_reuse(trace: Trace, chunk: int | None = None,
                       judged: Collection[str] | None = None,
                       prompts: Mapping[str, Sequence[int]] | None = None) -> Verdict:
    """Every finished request of a step-driven ``trace`` was served its prompt as the module's
    rules give: its reported cached tokens the block-aligned prefix it shares with an earlier
    request of the run (0 without prefix caching), its executed prompt tokens the rest, and
    where the runner says what it took from the cache (sendnn-inference 2.x), that amount and
    its prefill steps as chunk alignment allows. ``chunk`` is the prefill chunk in tokens
    (default: the one the scheduler recorded); ``judged``: the requests judged (default the
    finished ones, ``Trace.requests``; every request of the run, an aborted one included, counts
    as an earlier sharer with the tokens it computed); ``prompts``: the prompts of requests the
    trace holds nothing of (a trace recorded without its aborted requests)."""
    pool = _pool(trace)
    if pool is None or not any(s.executed for s in trace.steps):
        return Verdict.failed(KV_LEDGER_UNRECORDED, "prefix reuse: the trace records no"
                              " scheduler pool or no executed tokens: nothing to judge by")
    bs = int(pool.block_size or 0)
    chunk = chunk or next((v.chunk_size for r in trace.ledger_steps() for v in r.kv
                           if v.chunk_size), None)
    judged = trace.requests if judged is None else judged  # finished ones: aborted ones left
    served = {r: s for r, s in _serving(trace, prompts).items() if r in judged}
    for s in served.values():
        s.expected = block_hit(s.shared, s.prompt_len, bs) if pool.prefix_caching else 0
    problems = [(s, p) for s in sorted(served.values(), key=lambda x: (x.start or 0))
                for p in _judge(s, bs, chunk)]
    hits = [s for s in served.values() if s.sharer is not None and s.expected]
    if not problems:
        return Verdict.passed(PREFIX_REUSE, f"prefix reuse: {len(hits)} of {len(served)}"
                              " requests served from the cache as the rules give ("
                              f"{sum(s.reported for s in hits)} cached tokens)")
    first, why = problems[0]
    at = first.start if first.start is not None else -1
    lines = [f"prefix reuse: {why}", format_step_table(trace.ledger_steps(), at),
             f"{len(problems)} problem(s):", *(f"  {p}" for _, p in problems[:MAX_LISTED]),
             "requests (prompt service):", *(_line(s) for s in served.values())]
    return Verdict.failed(PREFIX_REUSE, f"prefix reuse: {why}", at=at, details="\n".join(lines))


def check_prefix_served(trace: Trace) -> Verdict:
    """The precondition of a prefix-reuse test: some request of the run was served part of its
    prompt from the cache, a prefix an earlier request of the run computed, and no request
    that shares nothing with an earlier one was (the engine held its blocks from an earlier
    run: what the run itself cached cannot be told apart then)."""
    pool = _pool(trace)
    bs = int(pool.block_size or 0) if pool is not None else 0
    served = ({r: s for r, s in _serving(trace).items() if r in trace.requests} if bs else {})
    hits = sorted(r for r, s in served.items()
                  if s.sharer is not None and block_hit(s.shared, s.prompt_len, bs) > 0)
    inherited = sorted(f"{r} ({s.reported} tokens)" for r, s in served.items()
                       if s.sharer is None and s.reported)
    if pool is None or not pool.prefix_caching:
        why = "prefix caching is off in this engine"
    elif inherited:
        why = (f"requests that share no prefix with an earlier request of the run were served"
               f" from the cache: {', '.join(inherited)}; the engine held their blocks from an"
               f" earlier run (run the test on a fresh engine)")
    elif not hits:
        why = "no request shares a whole block with an earlier request of the run"
    else:
        return Verdict.passed(PREFIX_SERVED, f"served from the cache: {', '.join(hits)}")
    return Verdict.failed(PREFIX_SERVED, f"prefix reuse never exercised: {why}")
