"""Faults injected into the real stack, to prove that each check can fail.

A fault is named in ``EngineConfig.faults`` (or with ``--inject-fault``) as
``NAME`` or ``NAME:key=value,key=value`` (``variant=ID`` installs it only in that target
variant's engines); NAME is a key of ``FAULTS``, or a
``package.module.function`` path when ``--allow-external-faults`` is given. It runs inside the engine process before
vLLM builds the engine, so it can patch vLLM or a plugin at class level.
Faults print a ``[hil] fault`` line to the engine log when they fire.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

FaultFn = Callable[..., None]

# Faults stay dormant through engine start-up (warmup, profiling) until armed.
_armed = {"on": False}


def arm() -> None:
    """Let installed faults fire from now on (called once the engine has started)."""
    _armed["on"] = True


def armed() -> bool:
    return _armed["on"]


def perturb_logit(config: dict[str, Any], position: str = "5", row: str = "0") -> None:
    """Once, at the ``position``-th sampling step after the engine started, make the
    least likely token the argmax in batch row ``row``: one wrong token, far from a
    near-tie. For a request running alone, that step is its generated position."""
    import torch
    from vllm.v1.sample.sampler import Sampler

    pos, r = int(position), int(row)
    original = Sampler.forward
    state = {"fired": False, "calls": 0}

    def forward(self: Any, logits: torch.Tensor, sampling_metadata: Any, *a: Any, **kw: Any) -> Any:
        if not armed() or state["fired"] or logits.shape[0] <= r:
            return original(self, logits, sampling_metadata, *a, **kw)
        state["calls"] += 1
        if state["calls"] == pos + 1:
            logits = logits.clone()
            worst = int(torch.argmin(logits[r]))
            logits[r, worst] = logits[r].max() + 20.0
            state["fired"] = True
            print(f"[hil] fault perturb_logit fired: row {r}, position {pos}, token {worst}",
                  flush=True)
        return original(self, logits, sampling_metadata, *a, **kw)

    Sampler.forward = forward  # type: ignore[method-assign]


def forget_free(config: dict[str, Any], after: str = "0") -> None:
    """The ``after``-th time (0-based) a request's blocks go back to vLLM's BlockPool once
    the engine has started, one block is dropped: neither free nor owned any more."""
    from vllm.v1.core.block_pool import BlockPool

    original = BlockPool.free_blocks
    state = {"calls": 0, "fired": False}

    def free_blocks(self: Any, ordered_blocks: Any) -> None:
        blocks = list(ordered_blocks)
        if armed() and not state["fired"] and blocks:
            if state["calls"] == int(after):
                state["fired"] = True
                print(f"[hil] fault forget_free fired: block {blocks[-1].block_id} not freed",
                      flush=True)
                blocks = blocks[:-1]
            state["calls"] += 1
        return original(self, blocks)

    BlockPool.free_blocks = free_blocks  # type: ignore[method-assign]


# The pool that holds a request's real blocks: on vllm-spyre the runner's own (tagged when
# the runner makes it; the scheduler's pool there is a stand-in), elsewhere vLLM's only pool.
_LEDGER_POOL_TAG = "_hil_ledger_pool"
FAULT_STATE_ENV = "HIL_FAULT_STATE_DIR"  # set by the engine pool: one folder per pytest process


def _tag_runner_pool(config: dict[str, Any]) -> bool:
    """On vllm-spyre 1.x, tag the pool the model runner makes; False where there is none."""
    if config.get("target") != "spyre":
        return False
    cls = getattr(_spyre_runner_module(), "ContinuousBatchingSpyreModelRunner", None)
    if cls is None or not hasattr(cls, "_make_block_pool"):
        return False  # legacy runners keep a plain free list: the scheduler's pool is it
    original = cls._make_block_pool

    def _make_block_pool(self: Any, *a: Any, **kw: Any) -> Any:
        pool = original(self, *a, **kw)
        setattr(pool, _LEDGER_POOL_TAG, True)
        return pool

    cls._make_block_pool = _make_block_pool  # type: ignore[method-assign]
    return True


def _drop_a_block_on_free(config: dict[str, Any], name: str, drop_now: Callable[[], bool]) -> None:
    """Patch vLLM's ``BlockPool.free_blocks`` on the ledger pool: when ``drop_now()`` says so,
    the last block of the request being freed is neither freed nor owned any more."""
    from vllm.v1.core.block_pool import BlockPool

    runner_only = _tag_runner_pool(config)
    original = BlockPool.free_blocks

    def free_blocks(self: Any, ordered_blocks: Any) -> None:
        blocks = list(ordered_blocks)
        ledger = getattr(self, _LEDGER_POOL_TAG, False) or not runner_only
        if armed() and ledger and blocks and drop_now():
            print(f"[hil] fault {name} fired: block {blocks[-1].block_id} not freed", flush=True)
            blocks = blocks[:-1]
        return original(self, blocks)

    BlockPool.free_blocks = free_blocks  # type: ignore[method-assign]


def forget_free_once(config: dict[str, Any]) -> None:
    """Once per pytest process (not per engine): the first request whose blocks go back to the
    ledger pool keeps one. A replacement engine started later in the run does not leak, so only
    the test whose scenario ran first on the faulty configuration leaks."""
    import os
    from pathlib import Path

    folder = os.environ.get(FAULT_STATE_ENV)
    marker = Path(folder) / "forget-free-once.fired" if folder else None
    fired = {"done": marker is not None and marker.exists()}

    def drop_now() -> bool:
        if fired["done"]:
            return False
        fired["done"] = True
        if marker is not None:
            marker.touch()
        return True

    _drop_a_block_on_free(config, "forget_free_once", drop_now)


def forget_free_each(config: dict[str, Any]) -> None:
    """Every request whose blocks go back to the ledger pool keeps one (a free that always
    forgets its last block): every test that frees blocks leaks in its own scenario."""
    _drop_a_block_on_free(config, "forget_free_each", lambda: True)


def leak_warmup_block(config: dict[str, Any]) -> None:
    """vllm-spyre: a warmup request's reservation is never released, so the runner keeps
    counting blocks for a request that no longer exists after warmup."""
    smr = _spyre_runner_module()

    cls = smr.ContinuousBatchingSpyreModelRunner
    original = cls.complete_warmup

    def complete_warmup(self: Any, *a: Any, **kw: Any) -> Any:
        out = original(self, *a, **kw)
        self.req_ids2num_reserved_blocks["warmup-0"] = 1
        print("[hil] fault leak_warmup_block fired: warmup-0 keeps 1 reserved block", flush=True)
        return out

    cls.complete_warmup = complete_warmup  # type: ignore[method-assign]


def kv_blocks_short(config: dict[str, Any], by: str = "1") -> None:
    """The device provides ``by`` fewer KV blocks than configured (num_gpu_blocks_override)."""
    from vllm.engine.arg_utils import EngineArgs

    original = EngineArgs.create_engine_config

    def create_engine_config(self: Any, *a: Any, **kw: Any) -> Any:
        if self.num_gpu_blocks_override:
            self.num_gpu_blocks_override -= int(by)
            print(f"[hil] fault kv_blocks_short: override now {self.num_gpu_blocks_override}",
                  flush=True)
        return original(self, *a, **kw)

    EngineArgs.create_engine_config = create_engine_config  # type: ignore[method-assign]


def block_too_many(config: dict[str, Any]) -> None:
    """vLLM takes one KV block more from the pool for every request than its tokens need:
    admission counts it, the request holds it until its blocks are freed (finish or
    preemption), and the model runner never sees it (its block table stays as wide as
    max_model_len needs), as an allocator that rounds up once too often would."""
    from vllm.v1.core.single_type_kv_cache_manager import SingleTypeKVCacheManager

    cls = SingleTypeKVCacheManager
    count, allocate, free = cls.get_num_blocks_to_allocate, cls.allocate_new_blocks, cls.free
    extra: dict[tuple[int, str], Any] = {}  # (manager, request) -> the block it holds too many

    def get_num_blocks_to_allocate(self: Any, request_id: str, *a: Any, **kw: Any) -> int:
        n = count(self, request_id, *a, **kw)
        return n + 1 if armed() and (id(self), request_id) not in extra else n

    def allocate_new_blocks(self: Any, request_id: str, *a: Any, **kw: Any) -> Any:
        blocks = allocate(self, request_id, *a, **kw)
        if armed() and (id(self), request_id) not in extra:
            (block,) = self.block_pool.get_new_blocks(1)
            extra[(id(self), request_id)] = block
            print(f"[hil] fault block_too_many fired: {request_id} holds block"
                  f" {block.block_id} too many", flush=True)
        return blocks

    def free_blocks(self: Any, request_id: str) -> None:
        free(self, request_id)
        block = extra.pop((id(self), request_id), None)
        if block is not None:
            self.block_pool.free_blocks([block])

    cls.get_num_blocks_to_allocate = get_num_blocks_to_allocate  # type: ignore[method-assign]
    cls.allocate_new_blocks = allocate_new_blocks  # type: ignore[method-assign]
    cls.free = free_blocks  # type: ignore[method-assign]


def block_too_few(config: dict[str, Any]) -> None:
    """vLLM gives every request one KV block fewer than its tokens need, at admission and at
    every allocation (its last block's keys and values go wherever the runner's block table
    holds a stale entry)."""
    from vllm.v1.core.single_type_kv_cache_manager import SingleTypeKVCacheManager

    cls = SingleTypeKVCacheManager
    count, allocate = cls.get_num_blocks_to_allocate, cls.allocate_new_blocks
    state = {"fired": False}

    def fewer(self: Any, num_tokens: int) -> int:
        if not armed() or num_tokens <= 0:
            return num_tokens
        if not state["fired"]:
            state["fired"] = True
            print(f"[hil] fault block_too_few fired: requests sized one block of"
                  f" {self.block_size} tokens short", flush=True)
        return max(num_tokens - int(self.block_size), 0)

    def get_num_blocks_to_allocate(self: Any, request_id: str, num_tokens: int,
                                   *a: Any, **kw: Any) -> int:
        return count(self, request_id, fewer(self, num_tokens), *a, **kw)

    def allocate_new_blocks(self: Any, request_id: str, num_tokens: int,
                            *a: Any, **kw: Any) -> Any:
        return allocate(self, request_id, fewer(self, num_tokens), *a, **kw)

    cls.get_num_blocks_to_allocate = get_num_blocks_to_allocate  # type: ignore[method-assign]
    cls.allocate_new_blocks = allocate_new_blocks  # type: ignore[method-assign]


def silent_preemption(config: dict[str, Any]) -> None:
    """vLLM's scheduler preempts and recomputes as usual, but its preemption bookkeeping
    says nothing: no PREEMPTED event (the vllm:num_preemptions counter stays), the
    request's num_preemptions is put back, and the step's preempted ids are emptied."""
    from vllm.v1.core.sched.scheduler import Scheduler

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


def preempt_running_once(config: dict[str, Any], after: str = "2") -> None:
    """Once, vLLM's KV cache manager refuses the blocks a running request asks for at a
    decode step (the ``after``-th such request after start, 0-based), as a full pool would.
    Nothing else is touched: vLLM's own scheduler then preempts through its preemption
    path (frees the request, counts it, lists it as preempted) and resumes it later, asking
    the executor to run its prompt and output again. A negative control for targets whose
    pool never runs out by itself (vllm-spyre's stand-in block is max_model_len long).
    vllm-spyre's runner has no preemption path; on vllm-spyre it gets the narrowest one
    (harness.targets.spyre.resume): it drops the preempted request and prefills it again.
    """
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.request import RequestStatus

    original = KVCacheManager.allocate_slots
    state = {"seen": 0, "fired": False}

    def allocate_slots(self: Any, request: Any, *a: Any, **kw: Any) -> Any:
        decoding = (request.status == RequestStatus.RUNNING
                    and request.num_computed_tokens >= request.num_prompt_tokens)
        if armed() and decoding and not state["fired"]:
            if state["seen"] == int(after):
                state["fired"] = True
                print(f"[hil] fault preempt_running_once fired: no blocks for"
                      f" {request.request_id} at {request.num_computed_tokens} tokens",
                      flush=True)
                return None
            state["seen"] += 1
        return original(self, request, *a, **kw)

    KVCacheManager.allocate_slots = allocate_slots  # type: ignore[method-assign]
    if config.get("target") == "spyre":
        from harness.targets.spyre.resume import handle_preemption_in_runner

        handle_preemption_in_runner(_spyre_runner_module().ContinuousBatchingSpyreModelRunner)


def hide_preemption_counter(config: dict[str, Any]) -> None:
    """The engine's metrics lack the vllm:num_preemptions counter (a stack that does not
    export it, or stats turned off), so it must not read as zero preemptions."""
    from vllm import LLM

    original = LLM.get_metrics

    def get_metrics(self: Any, *a: Any, **kw: Any) -> Any:
        return [m for m in original(self, *a, **kw) if m.name != "vllm:num_preemptions"]

    LLM.get_metrics = get_metrics  # type: ignore[method-assign]


def crash_engine(config: dict[str, Any], when: str = "start") -> None:
    """The engine process dies: at start (a card that cannot come up) or at its first
    generate/step call (a card that falls over under load)."""
    import os

    if when == "start":
        print("[hil] fault crash_engine: exiting at start", flush=True)
        os._exit(3)
    from vllm.v1.engine.llm_engine import LLMEngine

    def step(self: Any, *a: Any, **kw: Any) -> Any:
        if armed():
            print("[hil] fault crash_engine: exiting during a step", flush=True)
            os._exit(3)
        return original(self, *a, **kw)

    original = LLMEngine.step
    LLMEngine.step = step  # type: ignore[method-assign]


def hang_engine(config: dict[str, Any]) -> None:
    """The engine stops answering at its first step after start (a hung device)."""
    import time

    from vllm.v1.engine.llm_engine import LLMEngine

    original = LLMEngine.step

    def step(self: Any, *a: Any, **kw: Any) -> Any:
        if armed():
            print("[hil] fault hang_engine: hanging", flush=True)
            while True:
                time.sleep(60)
        return original(self, *a, **kw)

    LLMEngine.step = step  # type: ignore[method-assign]


def _spyre_runner_module() -> Any:
    """vllm-spyre's runner module, imported after vLLM has resolved its platform (an early
    import would pin vLLM 0.9 to its unspecified platform)."""
    from vllm.platforms import current_platform

    current_platform.get_device_name  # noqa: B018 - resolves the platform plugin
    from vllm_spyre.v1.worker import spyre_model_runner

    return spyre_model_runner


def keep_dummy_on_join(config: dict[str, Any]) -> None:
    """vllm-spyre 0.3-0.4: when a new request joins a lone decoding request, the dummy that
    padded the decode batch keeps its blocks instead of returning them to the pool."""
    smr = _spyre_runner_module()

    cls = smr.ContinuousBatchingSpyreModelRunner
    original = cls._update_states

    def _update_states(self: Any, scheduler_output: Any) -> Any:
        joining = armed() and bool(getattr(scheduler_output, "scheduled_new_reqs", None))
        kept = list(getattr(self, "dummy_req_ids2blocks", [])) if joining else []
        if kept:
            self.dummy_req_ids2blocks = []
        out = original(self, scheduler_output)
        if kept:
            self.dummy_req_ids2blocks = kept + list(self.dummy_req_ids2blocks)
            print(f"[hil] fault keep_dummy_on_join fired: dummy keeps blocks {kept}", flush=True)
        return out

    cls._update_states = _update_states  # type: ignore[method-assign]


def open_other_card(config: dict[str, Any], address: str) -> None:
    """The engine's runtime is pointed at another card than the leased one (its
    AIU_WORLD_RANK_0), to prove the on-card verification fails."""
    import os

    os.environ["AIU_WORLD_RANK_0"] = address
    print(f"[hil] fault open-other-card: AIU_WORLD_RANK_0={address}", flush=True)


# -- ledger faults: each breaks exactly one KV ledger invariant first (harness/checks/ledger.py)


def _after_first_armed_free(action: Callable[[Any, list[Any]], str | None]) -> None:
    """Wrap vLLM's ``BlockPool.free_blocks``: after the first armed call that frees a block,
    run ``action(pool, freed)`` once; it returns the line to print (None: not yet)."""
    from vllm.v1.core.block_pool import BlockPool

    original = BlockPool.free_blocks
    state = {"fired": False}

    def free_blocks(self: Any, ordered_blocks: Any) -> None:
        blocks = list(ordered_blocks)
        out = original(self, blocks)
        if armed() and not state["fired"] and blocks:
            line = action(self, blocks)
            if line:
                state["fired"] = True
                print(line, flush=True)
        return out

    BlockPool.free_blocks = free_blocks  # type: ignore[method-assign]


def free_pad_block(config: dict[str, Any]) -> None:
    """The first time blocks go back to vLLM's pool after start, its pad (null) block is put
    in the free list too: breaks pad_never_owned and nothing else."""

    def action(pool: Any, freed: list[Any]) -> str:
        pool.free_block_queue.append(pool.null_block)
        return f"[hil] fault free_pad_block fired: pad block {pool.null_block.block_id} in the free list"

    _after_first_armed_free(action)


def refree_block(config: dict[str, Any]) -> None:
    """The first time blocks go back to vLLM's pool after start, the block last put in the
    free list is appended once more: the linked list still holds it once, but the pool's
    free counter counts it twice (breaks free_counter and nothing else)."""

    def action(pool: Any, freed: list[Any]) -> str | None:
        queue = pool.free_block_queue
        last = queue.fake_free_list_tail.prev_free_block
        if last is None or last is queue.fake_free_list_head:
            return None
        queue.append(last)
        return f"[hil] fault refree_block fired: block {last.block_id} freed twice"

    _after_first_armed_free(action)


def extra_ref(config: dict[str, Any]) -> None:
    """The first block vLLM's pool hands out after start gets one reference too many (a
    holder counted twice): breaks ref_counts while it is held, before the block that
    never reaches ref count 0 again leaks at its free."""
    from vllm.v1.core.block_pool import BlockPool

    original = BlockPool.get_new_blocks
    state = {"fired": False}

    def get_new_blocks(self: Any, num_blocks: int) -> Any:
        blocks = original(self, num_blocks)
        if armed() and not state["fired"] and blocks:
            state["fired"] = True
            blocks[0].ref_cnt += 1
            print(f"[hil] fault extra_ref fired: block {blocks[0].block_id} ref count"
                  f" {blocks[0].ref_cnt}", flush=True)
        return blocks

    BlockPool.get_new_blocks = get_new_blocks  # type: ignore[method-assign]


def keep_finished_blocks(config: dict[str, Any]) -> None:
    """vLLM's scheduler does not free the blocks of the first request that finishes after
    start: they stay owned by a request that no longer exists (every per-step invariant
    holds; idle_all_free breaks at idle)."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    original = KVCacheManager.free
    state = {"fired": False}

    def free(self: Any, request: Any) -> None:
        if armed() and not state["fired"]:
            state["fired"] = True
            print(f"[hil] fault keep_finished_blocks fired: {request.request_id} keeps its"
                  " blocks", flush=True)
            return None
        return original(self, request)

    KVCacheManager.free = free  # type: ignore[method-assign]


def forget_free_in_runner(config: dict[str, Any]) -> None:
    """vllm-spyre 1.x: the first time a request's blocks go back to the runner's own pool
    after start, one block is dropped (neither free nor owned). vLLM's stand-in pool in
    the scheduler is left alone, so conservation breaks in the runner's pool only."""
    smr = _spyre_runner_module()
    cls = smr.ContinuousBatchingSpyreModelRunner
    original_make = cls._make_block_pool
    state = {"fired": False}

    def _make_block_pool(self: Any) -> Any:
        pool = original_make(self)
        original_free = pool.free_blocks

        def free_blocks(ordered_blocks: Any) -> None:
            blocks = list(ordered_blocks)
            if armed() and not state["fired"] and blocks:
                state["fired"] = True
                print(f"[hil] fault forget_free_in_runner fired: block {blocks[-1].block_id}"
                      " not freed", flush=True)
                blocks = blocks[:-1]
            return original_free(blocks)

        pool.free_blocks = free_blocks
        return pool

    cls._make_block_pool = _make_block_pool  # type: ignore[method-assign]


def reserve_short(config: dict[str, Any]) -> None:
    """vllm-spyre 1.x: the first request prefilled after start gets a reservation one block
    smaller than the blocks it already owns (breaks within_reservation first)."""
    smr = _spyre_runner_module()
    cls = smr.ContinuousBatchingSpyreModelRunner
    original = cls._prepare_prompt
    state = {"fired": False}

    def _prepare_prompt(self: Any, new_request_data: Any, *a: Any, **kw: Any) -> Any:
        out = original(self, new_request_data, *a, **kw)
        if armed() and not state["fired"] and new_request_data:
            req_id = new_request_data[0].req_id
            owned = len(self._get_blocks(req_id))
            if owned:
                state["fired"] = True
                self.req_ids2num_reserved_blocks[req_id] = owned - 1
                print(f"[hil] fault reserve_short fired: {req_id} owns {owned} blocks,"
                      f" reserves {owned - 1}", flush=True)
        return out

    cls._prepare_prompt = _prepare_prompt  # type: ignore[method-assign]


def reserve_extra(config: dict[str, Any]) -> None:
    """vllm-spyre 1.x CB: every request reserves one block more than the runner's own
    worst-case arithmetic at prefill (an off-by-one in the reservation). Nothing is
    owned beyond the reservation, so no ledger invariant breaks: only a pool that the
    batch's reservations fill exactly shows it (the last request is held back)."""
    smr = _spyre_runner_module()
    cls = smr.ContinuousBatchingSpyreModelRunner
    original = cls._prepare_prompt

    def _prepare_prompt(self: Any, new_request_data: Any, *a: Any, **kw: Any) -> Any:
        out = original(self, new_request_data, *a, **kw)
        if armed():
            for req in new_request_data or ():
                if req.req_id in self.req_ids2num_reserved_blocks:
                    self.req_ids2num_reserved_blocks[req.req_id] += 1
        return out

    cls._prepare_prompt = _prepare_prompt  # type: ignore[method-assign]


def leak_reservation(config: dict[str, Any]) -> None:
    """vllm-spyre 1.x: the runner keeps the reservation of the first request that finishes
    after start: its blocks are freed, but the free count it reports to the scheduler
    still subtracts them (breaks reported_free first, then idle_all_free)."""
    smr = _spyre_runner_module()
    cls = smr.ContinuousBatchingSpyreModelRunner
    original = cls.update_states
    state = {"fired": False}

    def update_states(self: Any, scheduler_output: Any) -> Any:
        finished = [r for r in scheduler_output.finished_req_ids
                    if r in self.req_ids2num_reserved_blocks]
        kept = {r: self.req_ids2num_reserved_blocks[r] for r in finished[:1]}
        out = original(self, scheduler_output)
        if armed() and not state["fired"] and kept:
            state["fired"] = True
            self.req_ids2num_reserved_blocks.update(kept)
            print(f"[hil] fault leak_reservation fired: keeps {kept}", flush=True)
        return out

    cls.update_states = update_states  # type: ignore[method-assign]


def legacy_double_free(config: dict[str, Any], req: str = "") -> None:
    """vllm-spyre 0.3-0.4: when the first finished request (whose id starts with ``req``)
    gives its blocks back, its last block goes into the runner's free deque twice (breaks
    no_double_free and nothing else)."""
    smr = _spyre_runner_module()
    cls = smr.ContinuousBatchingSpyreModelRunner
    original = cls._update_states
    state = {"fired": False}

    def _update_states(self: Any, scheduler_output: Any) -> Any:
        victims = [r for r in scheduler_output.finished_req_ids
                   if str(r).startswith(req) and self.req_ids2blocks.get(r)]
        last = list(self.req_ids2blocks[victims[0]])[-1] if victims else None
        out = original(self, scheduler_output)
        if armed() and not state["fired"] and last is not None:
            state["fired"] = True
            self.free_blocks.append(last)
            print(f"[hil] fault legacy_double_free fired: block {last} freed twice", flush=True)
        return out

    cls._update_states = _update_states  # type: ignore[method-assign]


def misname_dummy(config: dict[str, Any]) -> None:
    """The legacy ledger adapter (harness.in_engine.probes) no longer recognises the runner's
    padding dummy: its blocks are listed under an ordinary request id, so the ledger still
    adds up but no dummy is seen (a broken adapter, not a broken runner)."""
    from harness.in_engine import probes

    probes.LEGACY_DUMMY_ID = "padding"
    print("[hil] fault misname_dummy: the legacy dummy is listed as 'padding'", flush=True)
def _patch_logits(perturb: Callable[[Any], Any]) -> None:
    """Route the logits every engine step hands to vLLM's sampler through ``perturb`` (after
    start-up), before the sampler computes the logprobs it reports: as a kernel error would."""
    from vllm.v1.sample.sampler import Sampler

    original = Sampler.forward

    def forward(self: Any, logits: Any, sampling_metadata: Any, *a: Any, **kw: Any) -> Any:
        if armed():
            logits = perturb(logits)
        return original(self, logits, sampling_metadata, *a, **kw)

    Sampler.forward = forward  # type: ignore[method-assign]


def kernel_drift(config: dict[str, Any], rel: str = "0.03") -> None:
    """A small numerics error in a kernel: the final RMSNorm's gain is off by ``rel`` (relative),
    so every logit (the LM head is linear, without bias) is scaled by ``1 + rel``. The argmax
    never changes, so greedy tokens stay equal at every position; the logprobs move."""
    eps = float(rel)
    said = {"done": False}

    def perturb(logits: Any) -> Any:
        if not said["done"]:
            said["done"] = True
            print(f"[hil] fault kernel_drift fired: logits scaled by {1 + eps:g}", flush=True)
        return logits * (1 + eps)

    _patch_logits(perturb)


def drift_after_near_tie(config: dict[str, Any], after: str = "3", tol: str = "0.05") -> None:
    """A device that wanders off a few tokens after an honest near-tie: at the first decode step
    of an engine call where a batch row's own top-2 probabilities are within ``tol``, that row
    takes the runner-up (the swap a near-tie allows); ``after`` steps later, the same row's least
    likely token becomes its argmax. Rows of a batch keep their slot while every request decodes
    (equal lengths), so the row is the same request. Re-armed at each ``LLM.generate`` call, so a
    teacher-forced run of the same requests meets the same error."""
    import torch
    from vllm import LLM

    n_after, gap_tol = int(after), float(tol)
    state: dict[str, Any] = {"row": None, "calls": 0, "rows": 0, "done": False}
    original_generate = LLM.generate

    def generate(self: Any, *a: Any, **kw: Any) -> Any:
        state.update(row=None, calls=0, rows=0, done=False)
        return original_generate(self, *a, **kw)

    LLM.generate = generate  # type: ignore[method-assign]

    def perturb(logits: torch.Tensor) -> torch.Tensor:
        state["calls"] += 1
        if state["done"]:
            return logits
        if state["row"] is None:
            if state["calls"] < 2:  # the prefill's first token: rows are not decode slots yet
                return logits
            probs = torch.softmax(logits.float(), dim=-1)
            top = torch.topk(probs, 2, dim=-1)
            gaps = top.values[:, 0] - top.values[:, 1]
            rows = torch.nonzero(gaps <= gap_tol).flatten().tolist()
            if not rows:
                return logits
            r = int(rows[0])
            logits = logits.clone()
            a_id, b_id = int(top.indices[r, 0]), int(top.indices[r, 1])
            logits[r, a_id], logits[r, b_id] = logits[r, b_id].clone(), logits[r, a_id].clone()
            state.update(row=r, rows=logits.shape[0], fired_at=state["calls"])
            print(f"[hil] fault drift_after_near_tie: near-tie swap in row {r}"
                  f" (gap {float(gaps[r]):.4f}), tokens {a_id}<->{b_id}", flush=True)
            return logits
        if state["calls"] == state["fired_at"] + n_after and logits.shape[0] == state["rows"]:
            r = state["row"]
            logits = logits.clone()
            worst = int(torch.argmin(logits[r]))
            logits[r, worst] = logits[r].max() + 20.0
            state["done"] = True
            print(f"[hil] fault drift_after_near_tie fired: row {r}, {n_after} steps after the"
                  f" near-tie, token {worst}", flush=True)
        return logits

    _patch_logits(perturb)


FAULTS: dict[str, FaultFn] = {
    "keep-dummy-on-join": keep_dummy_on_join,
    "crash-engine": crash_engine,
    "hang-engine": hang_engine,
    "perturb-logit": perturb_logit,
    "forget-free": forget_free,
    "forget-free-once": forget_free_once,
    "forget-free-each": forget_free_each,
    "leak-warmup-block": leak_warmup_block,
    "kv-blocks-short": kv_blocks_short,
    "open-other-card": open_other_card,
    "free-pad-block": free_pad_block,
    "refree-block": refree_block,
    "extra-ref": extra_ref,
    "keep-finished-blocks": keep_finished_blocks,
    "forget-free-in-runner": forget_free_in_runner,
    "reserve-short": reserve_short,
    "reserve-extra": reserve_extra,
    "leak-reservation": leak_reservation,
    "legacy-double-free": legacy_double_free,
    "misname-dummy": misname_dummy,
    "block-too-many": block_too_many,
    "block-too-few": block_too_few,
    "silent-preemption": silent_preemption,
    "preempt-running-once": preempt_running_once,
    "hide-preemption-counter": hide_preemption_counter,
    "kernel-drift": kernel_drift,
    "drift-after-near-tie": drift_after_near_tie,
}


ALLOW_EXTERNAL_ENV = "HIL_ALLOW_EXTERNAL_FAULTS"


def parse_fault(spec: str, allow_external: bool = False) -> tuple[FaultFn, dict[str, str]]:
    """``NAME[:k=v,...]`` -> (function, keyword arguments as strings). A
    ``module.function`` NAME imports and calls code, so it needs ``allow_external``."""
    name, _, argstr = spec.partition(":")
    kwargs: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in argstr.split(","))):
        key, eq, value = part.partition("=")
        if not eq:
            raise ValueError(f"fault {spec!r}: argument {part!r} is not key=value")
        kwargs[key.strip()] = value.strip()
    if name in FAULTS:
        return FAULTS[name], kwargs
    if "." in name and allow_external:
        module, _, func = name.rpartition(".")
        return getattr(importlib.import_module(module), func), kwargs
    if "." in name:
        raise ValueError(
            f"fault {name!r} is not one of the harness's faults ({', '.join(FAULTS)}); a"
            " module.function fault imports and runs code from outside the harness: pass"
            " --allow-external-faults to allow it"
        )
    raise ValueError(f"unknown fault {name!r}; known: {', '.join(FAULTS)}"
                     " (or a module.function path with --allow-external-faults)")


def env_fault_specs(value: str) -> list[str]:
    """The fault specs of a ``HIL_FAULTS`` value (separated by ";")."""
    return [x.strip() for x in value.split(";") if x.strip()]


def check_fault_specs(value: str, allow_external: bool = False) -> None:
    """Raise ValueError for a ``HIL_FAULTS`` value naming a fault not allowed (nothing is
    imported for a known name; an external one is only checked by name here)."""
    for spec in env_fault_specs(value):
        name = spec.partition(":")[0]
        if name in FAULTS or ("." in name and allow_external):
            continue
        parse_fault(spec, allow_external=False)  # raises with the message


def apply_faults(specs: list[str], config: dict[str, Any]) -> None:
    """Install every fault in ``specs`` and in ``$HIL_FAULTS`` (separated by ";"; set per
    device in an inventory to simulate a broken card); called before vLLM starts.
    External ``module.function`` faults only with ``$HIL_ALLOW_EXTERNAL_FAULTS=1``, which
    ``--allow-external-faults`` sets."""
    import os

    allow = os.environ.get(ALLOW_EXTERNAL_ENV, "") not in ("", "0")
    env_specs = env_fault_specs(os.environ.get("HIL_FAULTS", ""))
    for spec in list(specs) + env_specs:
        fn, kwargs = parse_fault(spec, allow_external=allow)
        # Any fault takes variant=ID (spyre-eager-cb, vllm-cpu): installed only in that
        # variant's engines, so one run can prove one fault per target.
        variant = kwargs.pop("variant", None)
        if variant is not None and variant != engine_variant(config):
            print(f"[hil] fault not installed (for {variant}): {spec}", flush=True)
            continue
        fn(config, **kwargs)
        print(f"[hil] fault installed: {spec}", flush=True)


def engine_variant(config: dict[str, Any]) -> str:
    """The variant id of an engine configuration dict (``EngineConfig.variant_id``)."""
    return "-".join(str(config[k]) for k in ("target", "backend", "mode") if config.get(k))
