"""Faults in sendnn-inference 2.x (vllm-spyre renamed): the scheduler's promises and pausing,
and the runner's own block table, for ``harness.in_engine.faults``.

2.x keeps every KV block in vLLM's scheduler pool (the ledger pool, ``vllm-scheduler``). Its
chunked-prefill scheduler (``ChunkedPrefillSpyreScheduler``) admits a request only when the
pool can hold its prompt and max_tokens, and promises it the blocks not yet allocated
(``reserved_blocks``, summed in ``total_reserved_blocks``): ``schedule`` discounts each block
it hands out, ``update_from_output`` drops the promise of a request that finished. It may
pause a decoding request when the batch's next TKV would pass the batch TKV limit
(``_can_decode_all_requests``). The runner (``ChunkedPrefillModelRunner``) keeps its own copy
of each request's block ids (``requests[id].block_ids``) and drops it when the request's id
arrives in ``finished_req_ids``. Each fault here breaks one of these first
(harness/checks/promises.py: ``promises``, ``runner_table``) or pauses a request at full
batch (harness/checks/preemption.py: ``no_preemption``, "pause:").

Declared in ``SpyreTarget.fault_modules`` beside ``faults.py`` (vllm-spyre 0.x-1.x). The
plugin is imported only when a fault is installed; on another generation the fault refuses
to install, saying which one it needs.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterable, Sequence
from typing import Any

from harness.in_engine.fault_registry import Once, armed, fault
from harness.targets.spyre.generations import SENDNN_INFERENCE


def plugin_module(name: str, fault_name: str) -> Any:
    """``sendnn_inference.<name>``, imported after vLLM has resolved its platform; ValueError
    naming ``fault_name`` where sendnn-inference is not installed."""
    if importlib.util.find_spec(SENDNN_INFERENCE.module) is None:
        raise ValueError(f"fault {fault_name} patches {SENDNN_INFERENCE.name}"
                         f" ({SENDNN_INFERENCE.module}), which this engine's stack does not have")
    from vllm.platforms import current_platform  # defers a heavy import

    current_platform.get_device_name  # noqa: B018 - resolves the platform plugin
    return importlib.import_module(f"{SENDNN_INFERENCE.module}.{name}")


def scheduler_class(fault_name: str) -> Any:
    """The 2.x chunked-prefill scheduler class."""
    return plugin_module("v1.core.scheduler", fault_name).ChunkedPrefillSpyreScheduler


def runner_class(fault_name: str) -> Any:
    """The 2.x chunked-prefill model runner class."""
    return plugin_module("v1.worker.spyre_model_runner", fault_name).ChunkedPrefillModelRunner


# -- pure parts (tests/unit/targets/spyre/test_faults_2x.py)


def dropped_promises(before: dict[str, int], after: dict[str, int]) -> list[tuple[str, int]]:
    """The requests whose promise of one block or more went away between ``before`` and
    ``after``, with that promise, in id order."""
    return [(r, n) for r, n in sorted(before.items()) if n > 0 and r not in after]


def blocks_handed_out(req_ids: Sequence[str],
                      new_block_ids: Sequence[Any]) -> list[tuple[str, int]]:
    """(request, blocks) of each scheduled running request that got new blocks at this step
    (``CachedRequestData.req_ids`` and ``new_block_ids``: one list per KV cache group)."""
    out = []
    for req_id, groups in zip(req_ids, new_block_ids, strict=True):
        n = len(groups[0]) if groups else 0
        if n:
            out.append((req_id, n))
    return out


def wrong_block(ids: Iterable[int], num_blocks: int, pad: int = 0) -> int:
    """The highest block of a pool of ``num_blocks`` that is neither ``pad`` nor in ``ids``
    (a real block the request was not given)."""
    taken = set(ids) | {pad}
    for b in range(num_blocks - 1, -1, -1):
        if b not in taken:
            return b
    raise ValueError(f"no block of a pool of {num_blocks} is free of {sorted(taken)}")


def first_finished(finished_req_ids: Iterable[str] | None, table: dict[str, Any]) -> str | None:
    """The first (in id order) of the finished requests the runner still has a state for."""
    held = sorted(str(r) for r in finished_req_ids or () if r in table)
    return held[0] if held else None


# -- the scheduler's promises


@fault("keep-promise")
def keep_promise(config: dict[str, Any]) -> None:
    """sendnn-inference 2.x: the first time a request finishes with blocks still promised (its
    prompt and max_tokens needed a block its output never reached), ``update_from_output``
    does not drop that promise: the request is gone, its promise and the total still count
    it, and admission has that many blocks fewer (breaks promises: a leaked reservation,
    then idle_all_free). A request whose promise is already 0 at its finish leaks nothing."""
    cls = scheduler_class("keep-promise")
    original = cls.update_from_output
    once = Once()

    def update_from_output(self: Any, scheduler_output: Any, model_runner_output: Any) -> Any:
        before = dict(self.reserved_blocks)
        out = original(self, scheduler_output, model_runner_output)
        dropped = dropped_promises(before, self.reserved_blocks)
        if dropped and once.due():
            req_id, n = dropped[0]
            self.reserved_blocks[req_id] = n
            self.total_reserved_blocks += n
            once.fire(f"[hil] fault keep_promise fired: {req_id} finished, its promise of {n}"
                      f" block(s) kept")
        return out

    cls.update_from_output = update_from_output  # type: ignore[method-assign]


@fault("promise-total-drift")
def promise_total_drift(config: dict[str, Any]) -> None:
    """sendnn-inference 2.x: the first time after start that ``schedule`` hands a running
    request blocks it was promised, they are discounted from the request's promise but not
    from the scheduler's total: the total promises a block no request holds a promise for,
    to the end (breaks promises first, then idle_all_free with the total still above 0).
    Only the total drifts: a promise gone negative would stop the plugin's own assertion."""
    cls = scheduler_class("promise-total-drift")
    original = cls.schedule
    once = Once()

    def schedule(self: Any, *a: Any, **kw: Any) -> Any:
        out = original(self, *a, **kw)
        if armed():
            cached = out.scheduled_cached_reqs
            handed = blocks_handed_out(cached.req_ids, cached.new_block_ids)
            if handed and once.due():
                req_id, n = handed[0]
                self.total_reserved_blocks += n
                once.fire(f"[hil] fault promise_total_drift fired: {req_id} given {n} promised"
                          f" block(s), the total kept them: {self.total_reserved_blocks}")
        return out

    cls.schedule = schedule  # type: ignore[method-assign]


# -- pausing


@fault("pause-at-full-batch")
def pause_at_full_batch(config: dict[str, Any], after: str = "0") -> None:
    """sendnn-inference 2.x: once, at the ``after``-th (0-based) decode step whose batch is full
    (``max_num_seqs`` decoding requests), the scheduler judges that the full batch would pass
    the batch TKV limit and pauses the last request it considers for a step (it keeps its
    blocks, leaves the batch, and resumes at the next step), as a limit set below what a
    full batch needs would (breaks no_preemption: "pause:")."""
    cls = scheduler_class("pause-at-full-batch")
    original = cls._can_decode_all_requests
    once = Once(after)

    def _can_decode_all_requests(self: Any, decoding_requests: list[Any]) -> bool:
        full = len(decoding_requests) >= int(self.max_num_running_reqs)
        if full and once.due():
            once.fire(f"[hil] fault pause_at_full_batch fired: a full batch of"
                      f" {len(decoding_requests)} judged over the TKV limit, pauses"
                      f" {decoding_requests[-1].request_id}")
            return False
        return bool(original(self, decoding_requests))

    cls._can_decode_all_requests = _can_decode_all_requests  # type: ignore[method-assign]


# -- the runner's block table


@fault("runner-keeps-finished")
def runner_keeps_finished(config: dict[str, Any]) -> None:
    """sendnn-inference 2.x: the first time finished requests reach the runner after start,
    it drops the first of them from its batch but keeps its state, with its block ids, in
    its request table: the runner still holds blocks the pool freed, a step later and
    after (breaks runner_table)."""
    cls = runner_class("runner-keeps-finished")
    original = cls.update_states
    once = Once()

    def update_states(self: Any, scheduler_output: Any) -> Any:
        req_id = first_finished(scheduler_output.finished_req_ids, self.requests)
        kept = self.requests[req_id] if req_id is not None and once.due() else None
        out = original(self, scheduler_output)
        if kept is not None:
            self.requests[req_id] = kept
            once.fire(f"[hil] fault runner_keeps_finished fired: {req_id} finished, the runner"
                      f" keeps its blocks {list(kept.block_ids)}")
        return out

    cls.update_states = update_states  # type: ignore[method-assign]


@fault("runner-wrong-block")
def runner_wrong_block(config: dict[str, Any]) -> None:
    """sendnn-inference 2.x: the first request the runner takes in after start gets, in the
    runner's own table, a wrong last block: the highest block of the pool it was not given,
    in place of the one the scheduler gave it (the request then reads and writes its KV
    there; breaks runner_table)."""
    module = plugin_module("v1.worker.spyre_model_runner", "runner-wrong-block")
    cls = module.ChunkedPrefillModelRunner
    original = cls.add_new_request
    once = Once()

    def add_new_request(self: Any, request: Any) -> Any:
        out = original(self, request)
        state = self.requests.get(request.req_id)
        ids = list(getattr(state, "block_ids", None) or ())
        if ids and once.due():
            num_blocks = int(module.SpyrePlatform.get_total_spyre_blocks(self.vllm_config))
            wrong = wrong_block(ids, num_blocks)
            state.block_ids = ids[:-1] + [wrong]
            once.fire(f"[hil] fault runner_wrong_block fired: {request.req_id} given blocks"
                      f" {ids}, the runner holds {state.block_ids}")
        return out

    cls.add_new_request = add_new_request  # type: ignore[method-assign]


# -- the block count: the pool's against the KV cache the device allocated


def shifted_block_count(count: Any, override: int | None, step: int) -> int:
    """What ``formula-forgets-pad-block`` makes of the plugin's block count: ``count(o)`` is
    the plugin's count for the override ``o`` (None: the device decides); the faulty formula
    gives ``step`` blocks fewer, and judges an override against a minimum ``step`` lower
    (so its own minimum does not refuse what it decided)."""
    return int(count(None if override is None else override + step)) - step


@fault("runner-kv-short")
def runner_kv_short(config: dict[str, Any], by: str = "1") -> None:
    """sendnn-inference 2.x: after warmup the runner allocates its KV cache (the model's
    ``past_key_value_states``) ``by`` blocks short of the count it was given, while the
    scheduler's pool keeps the full count: the pool can hand out block ids the device's
    cache does not have (breaks device_blocks from the first snapshot, a defect; with ``by``
    2 the device-decided full-batch pool's KV cache no longer holds a full batch: capacity).
    Acts at start-up, armed or not."""
    from harness.targets.spyre.ledger import device_kv_blocks

    cls = runner_class("runner-kv-short")
    original = cls.complete_warmup

    def complete_warmup(self: Any) -> Any:
        out = original(self)
        given = device_kv_blocks(self)
        if given is not None:
            self.model.set_past_key_value_states(num_blocks=given - int(by))
            print(f"[hil] fault runner_kv_short fired: the runner's KV cache holds"
                  f" {device_kv_blocks(self)} blocks of the {given} it was given", flush=True)
        return out

    cls.complete_warmup = complete_warmup  # type: ignore[method-assign]


@fault("formula-forgets-pad-block")
def formula_forgets_pad_block(config: dict[str, Any]) -> None:
    """sendnn-inference 2.x: the block count the plugin decides for the device
    (``SpyrePlatform.get_total_spyre_blocks``) forgets the pad block: a full batch's blocks
    without it, and the round-up to a multiple of max_num_seqs that made room for it goes
    too, so the count is max_num_seqs blocks short; its own minimum moves down with it, so
    the engine starts. The scheduler's pool and the runner's KV cache agree, and neither
    holds a full batch (breaks capacity: the device-decided count cannot serve the full
    batch; on 2.x admission then holds the last request back)."""
    platform = plugin_module("platform", "formula-forgets-pad-block").SpyrePlatform
    original = platform.get_total_spyre_blocks  # bound to the class

    def get_total_spyre_blocks(cls: Any, vllm_config: Any) -> int:
        cache = vllm_config.cache_config
        override = cache.num_gpu_blocks_override
        step = int(vllm_config.scheduler_config.max_num_seqs)

        def count(o: int | None) -> int:
            cache.num_gpu_blocks_override = o
            try:
                return int(original(vllm_config))
            finally:
                cache.num_gpu_blocks_override = override

        n = shifted_block_count(count, override or None, step)
        if override is None:
            print(f"[hil] fault formula_forgets_pad_block fired: the device-decided count is"
                  f" {n} blocks, {step} short", flush=True)
        return n

    platform.get_total_spyre_blocks = classmethod(get_total_spyre_blocks)  # type: ignore[method-assign]


# -- admission by blocks: the promises' amounts, and the hold-back (harness/checks/admission.py)


class ClampedPromises(dict):  # type: ignore[type-arg]
    """The scheduler's ``reserved_blocks`` for ``promise-one-short``: a promise of ``short``
    that its request's last block would take below 0 stays at 0, and the block goes back onto
    the scheduler's total (``owner.total_reserved_blocks``), so the plugin's own assertions
    hold while the block is taken from the pool unpromised."""

    def __init__(self, data: dict[str, int], owner: Any, short: str) -> None:
        super().__init__(data)
        self.owner, self.short = owner, short

    def __setitem__(self, key: str, value: int) -> None:
        if key == self.short and value < 0:
            self.owner.total_reserved_blocks -= value  # what the total lost below 0
            value = 0
        super().__setitem__(key, value)


def first_promised(scheduled_new_reqs: Iterable[Any], promised: dict[str, int],
                   at_least: int = 1) -> str | None:
    """The first request scheduled for the first time at this step whose promise is at least
    ``at_least`` blocks."""
    for req in scheduled_new_reqs:
        if promised.get(req.req_id, 0) >= at_least:
            return str(req.req_id)
    return None


@fault("promise-one-short")
def promise_one_short(config: dict[str, Any]) -> None:
    """sendnn-inference 2.x: the first request admitted after start with a block promised is
    promised one block fewer than its prompt and max_tokens need (its promise and the total);
    the block it takes last then comes from the pool unpromised, so admission can let a
    newcomer into blocks a running request still needs (breaks promise_exact at the admission
    step: "1 block(s) too few promised")."""
    cls = scheduler_class("promise-one-short")
    original = cls.schedule
    once = Once()

    def schedule(self: Any, *a: Any, **kw: Any) -> Any:
        out = original(self, *a, **kw)
        req_id = first_promised(out.scheduled_new_reqs, self.reserved_blocks)
        if req_id is not None and once.due():
            self.reserved_blocks = ClampedPromises(self.reserved_blocks, self, req_id)
            self.reserved_blocks[req_id] -= 1
            self.total_reserved_blocks -= 1
            once.fire(f"[hil] fault promise_one_short fired: {req_id} admitted, promised"
                      f" {self.reserved_blocks[req_id]} block(s), one fewer than it needs")
        return out

    cls.schedule = schedule  # type: ignore[method-assign]


@fault("promise-one-extra")
def promise_one_extra(config: dict[str, Any]) -> None:
    """sendnn-inference 2.x: the first request admitted after start (where the pool has a
    free block beyond every promise) is promised one block more than its prompt and
    max_tokens need; the extra block is never handed out and holds a newcomer back until the
    request finishes (breaks promise_exact at the admission step: "1 block(s) too many
    promised")."""
    cls = scheduler_class("promise-one-extra")
    original = cls.schedule
    once = Once()

    def schedule(self: Any, *a: Any, **kw: Any) -> Any:
        out = original(self, *a, **kw)
        req_id = first_promised(out.scheduled_new_reqs, self.reserved_blocks, at_least=0)
        if (req_id is not None and self.total_reserved_blocks < self._get_free_blocks()
                and once.due()):
            self.reserved_blocks[req_id] += 1
            self.total_reserved_blocks += 1
            once.fire(f"[hil] fault promise_one_extra fired: {req_id} admitted, promised"
                      f" {self.reserved_blocks[req_id]} block(s), one more than it needs")
        return out

    cls.schedule = schedule  # type: ignore[method-assign]


@fault("hold-back-once")
def hold_back_once(config: dict[str, Any]) -> None:
    """sendnn-inference 2.x: the first time after start that the scheduler would admit a
    newcomer into a running batch (it fits, the batch has room, nothing else holds it), it
    holds it back for that step; it is admitted at the next (breaks hold_back: "held back
    although the scheduler had room for it")."""
    cls = scheduler_class("hold-back-once")
    original = cls.can_schedule_prefill
    once = Once()

    def can_schedule_prefill(self: Any, request: Any) -> bool:
        ok = bool(original(self, request))
        joins = ok and int(request.num_computed_tokens) == 0 and len(self.running) > 0
        if joins and once.due():
            once.fire(f"[hil] fault hold_back_once fired: {request.request_id} fits, held back"
                      f" for a step beside {len(self.running)} running")
            return False
        return ok

    cls.can_schedule_prefill = can_schedule_prefill  # type: ignore[method-assign]


@fault("free-blocks-overcounted")
def free_blocks_overcounted(config: dict[str, Any], by: str = "2") -> None:
    """sendnn-inference 2.x: once armed, the scheduler counts ``by`` blocks more free than its
    pool has (``_get_free_blocks``, which its admission and its own promise assertion read):
    where blocks run short it admits a newcomer the pool cannot hold beside its promises
    (breaks overcommit at that step; the pool then runs short under the requests it runs)."""
    cls = scheduler_class("free-blocks-overcounted")
    original = cls._get_free_blocks
    extra = int(by)
    once = Once()

    def _get_free_blocks(self: Any) -> int:
        n = int(original(self))
        if not armed():
            return n
        if once.due():
            once.fire(f"[hil] fault free_blocks_overcounted fired: the scheduler counts {extra}"
                      f" more free blocks than its pool's {n}")
        return n + extra

    cls._get_free_blocks = _get_free_blocks  # type: ignore[method-assign]
