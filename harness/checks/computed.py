"""What each request of a step-driven run had computed by a given step, from the trace's own
per-step records: the tokens whose KV the run wrote, which a later request can be served.

Read in vLLM 0.28 (``KVCacheManager.allocate_slots``): a request's block is cached (hashed,
and from then on served to any request that starts with the same tokens) as soon as the
scheduler schedules the token that fills it, since it caches ``num_computed_tokens +
num_new_tokens`` tokens when it allocates the step's slots; a request scheduled before another
in the same step counts with that step's tokens. The tokens counted are the request's sequence
in order, its prompt then its output; its last sampled token is not among them until the next
step runs it, so a finished request never computed its last token, and an aborted one (the
harness aborts it just before a step) computed what the steps before its abort ran.

A request starts where its prefix-cache hit ends (``RequestTrace.num_cached_tokens``) and
moves on by the tokens the executor ran for it (``StepRecord.executed``): ``position`` is its
length now. An aborted request's hit is what its prefill steps left unrun (``prompt_hit``):
vLLM 0.28 keeps a request's hit in its prefill stats, which it hands to the request's first
output, not on the scheduler's ``Request`` the harness reads an aborted request from, so the
recorded ``num_cached_tokens`` of an aborted request is 0 whatever its hit was. A preempted request (``StepRecord.preempted``) frees its blocks and computes its
tokens again when it runs again: from the start without prefix caching; with it, its blocks
stay cached and vLLM serves it its own whole blocks (nothing the run cached is evicted: the
checks that use this assume a pool that holds the run). It caches nothing new until it passes
the furthest it had got (``high``: the tokens of its sequence the cache holds blocks of).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from harness.core.trace import SOURCE_VLLM_SCHEDULER, KvSnapshot, Trace


def scheduler_pool(trace: Trace) -> KvSnapshot | None:
    """The scheduler's pool snapshot: its block size, whether prefix caching is on, the chunk."""
    for record in trace.ledger_steps():
        for s in record.kv:
            if s.source == SOURCE_VLLM_SCHEDULER and s.block_size:
                return s
    return None


def prompt_hit(trace: Trace, request_id: str, prompt: int) -> int | None:
    """The prompt tokens of ``request_id`` its first prefill did not run (its prefix-cache
    hit): its prompt less the tokens the executor ran for it at the steps that prefilled it
    (``StepRecord.prefilled``), up to its first step that did not. None where a step that ran
    it has no such record, or it was preempted or aborted before its prompt was all run."""
    ran = 0
    for record in trace.steps:
        if request_id in record.preempted:
            return None
        n = record.executed.get(request_id, 0)
        if not n:
            continue
        if record.prefilled is None:
            return None
        if request_id not in record.prefilled:
            return prompt - ran if 0 <= prompt - ran <= prompt else None
        ran += n
    return None


class ComputedTokens:
    """The leading tokens of each request's sequence the run has scheduled, fed one step at a
    time (``preempted`` then ``ran`` per request of the step, in the executor's order)."""

    def __init__(self, cached: Mapping[str, int], block_size: int,
                 prefix_caching: bool = True) -> None:
        """``cached``: each request's prefix-cache hit at its start; ``block_size`` and
        ``prefix_caching``: the pool's."""
        self.cached = cached
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.position: dict[str, int] = {}
        # The furthest each request got: the tokens of its sequence the cache holds blocks of.
        self.high: dict[str, int] = {}
        self._resuming: set[str] = set()

    @classmethod
    def of(cls, trace: Trace) -> ComputedTokens:
        """For every request ``trace`` ran (``Trace.ran``), in its scheduler's pool."""
        pool = scheduler_pool(trace)
        cached = {r: t.num_cached_tokens for r, t in trace.ran().items()}
        for r, t in trace.aborted.items():
            hit = prompt_hit(trace, r, len(t.prompt_token_ids))
            if hit is not None:
                cached[r] = hit
        return cls(cached,
                   int(pool.block_size or 0) if pool is not None else 0,
                   pool is not None and pool.prefix_caching)

    def preempted(self, ids: Iterable[str]) -> None:
        """The scheduler preempted ``ids`` this step: each computes again when it next runs."""
        self._resuming.update(r for r in ids if r in self.position)

    def start(self, request_id: str) -> int:
        """The tokens of ``request_id`` computed when the step now fed runs it: where it got,
        where its prefix-cache hit ends if it starts now, or where it computes again from if it
        resumes now."""
        if request_id in self._resuming:  # computed again, past its own cached whole blocks
            bs = self.block_size if self.prefix_caching else 0
            return self.high[request_id] // bs * bs if bs else 0
        return self.position.get(request_id, self.cached.get(request_id, 0))

    def ran(self, request_id: str, tokens: int) -> None:
        """The executor ran ``tokens`` tokens of ``request_id`` this step."""
        start = self.start(request_id)
        self._resuming.discard(request_id)
        self.position[request_id] = start + tokens
        self.high[request_id] = max(self.high.get(request_id, 0), start + tokens)
