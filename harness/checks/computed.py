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
moves on by the tokens the executor ran for it (``StepRecord.executed``). A preempted request
(``StepRecord.preempted``) frees its blocks but they stay cached; when it runs again vLLM
serves it its own whole blocks (nothing the run cached is evicted: the checks that use this
assume a pool that holds the run) and it computes the rest again, so it caches nothing new
until it passes the furthest it had got (``high``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


class ComputedTokens:
    """The leading tokens of each request's sequence the run has scheduled, fed one step at a
    time (``preempted`` then ``ran`` per request of the step, in the executor's order)."""

    def __init__(self, cached: Mapping[str, int], block_size: int) -> None:
        """``cached``: each request's prefix-cache hit at its start; ``block_size``: the pool's."""
        self.cached = cached
        self.block_size = block_size
        self.position: dict[str, int] = {}
        # The furthest each request got: the tokens of its sequence the cache holds blocks of.
        self.high: dict[str, int] = {}
        self._resuming: set[str] = set()

    def preempted(self, ids: Iterable[str]) -> None:
        """The scheduler preempted ``ids`` this step: each computes again when it next runs."""
        self._resuming.update(r for r in ids if r in self.position)

    def ran(self, request_id: str, tokens: int) -> None:
        """The executor ran ``tokens`` tokens of ``request_id`` this step."""
        if request_id in self._resuming:  # served its own cached whole blocks again
            self._resuming.discard(request_id)
            bs = self.block_size
            start = self.high[request_id] // bs * bs if bs else 0
        else:
            start = self.position.get(request_id, self.cached.get(request_id, 0))
        self.position[request_id] = start + tokens
        self.high[request_id] = max(self.high.get(request_id, 0), start + tokens)
