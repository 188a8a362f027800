"""Faults in vllm-spyre, and its parts of the generic faults, for ``harness.in_engine.faults``.

They patch its continuous-batching model runner (``vllm_spyre.v1.worker.spyre_model_runner``):
the runner's own block pool and reservations (1.x), the padding dummy and free deque of the
legacy runners (0.3-0.4), warmup, and the card the runtime opens. The target hooks tell the
generic block-pool faults which pool is the ledger pool, and give the runner a path for the
preemptions of ``preempt-running-once``. Declared in ``SpyreTarget.fault_modules``: the kind
registry imports it for ``harness.in_engine.faults``, and it registers its faults with
``harness.in_engine.fault_registry``; the plugin is imported only when a fault is installed,
the generation the engine's environment has (newest first, as ``SpyreTarget.engine_info``).
sendnn-inference 2.x keeps its blocks in vLLM's scheduler pool, so the generic faults land
there unchanged; its own faults are in ``faults_2x.py``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable
from typing import Any

from harness.in_engine.fault_registry import (
    LEDGER_POOL,
    RUNNER_PREEMPTION,
    Once,
    armed,
    fault,
    target_hook,
)
from harness.targets.spyre import ledger
from harness.targets.spyre.generations import GENERATIONS, VLLM_SPYRE, PluginGeneration
from harness.targets.spyre.resume import handle_preemption_in_runner

# The pool that holds a request's real blocks on vllm-spyre 1.x: the runner's own (tagged when
# the runner makes it; the scheduler's pool there is a stand-in).
_LEDGER_POOL_TAG = "_hil_ledger_pool"


def installed_generation() -> PluginGeneration:
    """The plugin generation this process can import (newest first); vllm-spyre 1.x when none
    is (its import then fails naming the module)."""
    for gen in GENERATIONS:
        if importlib.util.find_spec(gen.module) is not None:
            return gen
    return VLLM_SPYRE


def runner_module() -> Any:
    """The installed plugin's runner module, imported after vLLM has resolved its platform (an
    early import would pin vLLM 0.9 to its unspecified platform)."""
    from vllm.platforms import current_platform  # defers a heavy import

    current_platform.get_device_name  # noqa: B018 - resolves the platform plugin
    return importlib.import_module(f"{installed_generation().module}.v1.worker.spyre_model_runner")


def _runner_class() -> Any:
    """vllm-spyre's continuous-batching runner; ValueError on a generation without one."""
    cls = getattr(runner_module(), "ContinuousBatchingSpyreModelRunner", None)
    if cls is None:
        gen = installed_generation()
        raise ValueError(f"this fault patches vllm-spyre's ContinuousBatchingSpyreModelRunner,"
                         f" which {gen.name} ({gen.module}) does not have; its faults are in"
                         f" harness/targets/spyre/faults_2x.py")
    return cls


# -- target hooks: vllm-spyre's part of the generic faults


@target_hook(LEDGER_POOL, "spyre")
def tag_runner_pool(config: dict[str, Any]) -> Callable[[Any], bool] | None:
    """On vllm-spyre 1.x, tag the pool the model runner makes and say that it is the ledger
    pool; None where there is none (legacy runners keep a plain free list: the scheduler's
    pool is it)."""
    cls = getattr(runner_module(), "ContinuousBatchingSpyreModelRunner", None)
    if cls is None or not hasattr(cls, "_make_block_pool"):
        return None
    original = cls._make_block_pool

    def _make_block_pool(self: Any, *a: Any, **kw: Any) -> Any:
        pool = original(self, *a, **kw)
        setattr(pool, _LEDGER_POOL_TAG, True)
        return pool

    cls._make_block_pool = _make_block_pool  # type: ignore[method-assign]
    return lambda pool: getattr(pool, _LEDGER_POOL_TAG, False)


@target_hook(RUNNER_PREEMPTION, "spyre")
def runner_preemption(config: dict[str, Any]) -> None:
    """vllm-spyre's runner has no preemption path: give it the narrowest one (it drops the
    preempted request and prefills it again; harness.targets.spyre.resume). Not for
    sendnn-inference 2.x, whose scheduler promises blocks ahead and pauses instead: refused."""
    gen = installed_generation()
    if gen.kv_home == "scheduler":
        raise ValueError(f"{gen.name} has no path for a preemption by vLLM's scheduler (its"
                         " scheduler promises every block a request can need and pauses"
                         " instead), and the harness gives its runner none: a forced preemption"
                         " is a vllm-spyre 1.x control")
    handle_preemption_in_runner(_runner_class())


# -- the runner's block pool and reservations (vllm-spyre 1.x)


@fault("forget-free-in-runner")
def forget_free_in_runner(config: dict[str, Any]) -> None:
    """vllm-spyre 1.x: the first time a request's blocks go back to the runner's own pool
    after start, one block is dropped (neither free nor owned). vLLM's stand-in pool in
    the scheduler is left alone, so conservation breaks in the runner's pool only."""
    cls = _runner_class()
    original_make = cls._make_block_pool
    once = Once()  # shared by every pool the runner makes

    def _make_block_pool(self: Any) -> Any:
        pool = original_make(self)
        original_free = pool.free_blocks

        def free_blocks(ordered_blocks: Any) -> None:
            blocks = list(ordered_blocks)
            if blocks and once.due():
                once.fire(f"[hil] fault forget_free_in_runner fired: block"
                          f" {blocks[-1].block_id} not freed")
                blocks = blocks[:-1]
            return original_free(blocks)

        pool.free_blocks = free_blocks
        return pool

    cls._make_block_pool = _make_block_pool  # type: ignore[method-assign]


@fault("reserve-short")
def reserve_short(config: dict[str, Any]) -> None:
    """vllm-spyre 1.x: the first request prefilled after start gets a reservation one block
    smaller than the blocks it already owns (breaks within_reservation first)."""
    cls = _runner_class()
    original = cls._prepare_prompt
    once = Once()

    def _prepare_prompt(self: Any, new_request_data: Any, *a: Any, **kw: Any) -> Any:
        out = original(self, new_request_data, *a, **kw)
        if new_request_data and once.due():
            req_id = new_request_data[0].req_id
            owned = len(self._get_blocks(req_id))
            if owned:
                self.req_ids2num_reserved_blocks[req_id] = owned - 1
                once.fire(f"[hil] fault reserve_short fired: {req_id} owns {owned} blocks,"
                          f" reserves {owned - 1}")
        return out

    cls._prepare_prompt = _prepare_prompt  # type: ignore[method-assign]


@fault("reserve-extra")
def reserve_extra(config: dict[str, Any]) -> None:
    """vllm-spyre 1.x CB: every request reserves one block more than the runner's own
    worst-case arithmetic at prefill (an off-by-one in the reservation). Nothing is
    owned beyond the reservation, so no ledger invariant breaks: only a pool that the
    batch's reservations fill exactly shows it (the last request is held back)."""
    cls = _runner_class()
    original = cls._prepare_prompt

    def _prepare_prompt(self: Any, new_request_data: Any, *a: Any, **kw: Any) -> Any:
        out = original(self, new_request_data, *a, **kw)
        if armed():
            for req in new_request_data or ():
                if req.req_id in self.req_ids2num_reserved_blocks:
                    self.req_ids2num_reserved_blocks[req.req_id] += 1
        return out

    cls._prepare_prompt = _prepare_prompt  # type: ignore[method-assign]


@fault("leak-reservation")
def leak_reservation(config: dict[str, Any]) -> None:
    """vllm-spyre 1.x: the runner keeps the reservation of the first request that finishes
    after start: its blocks are freed, but the free count it reports to the scheduler
    still subtracts them (breaks reported_free first, then idle_all_free)."""
    cls = _runner_class()
    original = cls.update_states
    once = Once()

    def update_states(self: Any, scheduler_output: Any) -> Any:
        finished = [r for r in scheduler_output.finished_req_ids
                    if r in self.req_ids2num_reserved_blocks]
        kept = {r: self.req_ids2num_reserved_blocks[r] for r in finished[:1]}
        out = original(self, scheduler_output)
        if kept and once.due():
            self.req_ids2num_reserved_blocks.update(kept)
            once.fire(f"[hil] fault leak_reservation fired: keeps {kept}")
        return out

    cls.update_states = update_states  # type: ignore[method-assign]


@fault("leak-warmup-block")
def leak_warmup_block(config: dict[str, Any]) -> None:
    """vllm-spyre: a warmup request's reservation is never released, so the runner keeps
    counting blocks for a request that no longer exists after warmup."""
    cls = _runner_class()
    original = cls.complete_warmup

    def complete_warmup(self: Any, *a: Any, **kw: Any) -> Any:
        out = original(self, *a, **kw)
        self.req_ids2num_reserved_blocks["warmup-0"] = 1
        print("[hil] fault leak_warmup_block fired: warmup-0 keeps 1 reserved block", flush=True)
        return out

    cls.complete_warmup = complete_warmup  # type: ignore[method-assign]


# -- the legacy runners (vllm-spyre 0.3-0.4): padding dummy and free deque


@fault("keep-dummy-on-join")
def keep_dummy_on_join(config: dict[str, Any]) -> None:
    """vllm-spyre 0.3-0.4: when a new request joins a lone decoding request, the dummy that
    padded the decode batch keeps its blocks instead of returning them to the pool."""
    cls = _runner_class()
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


@fault("legacy-double-free")
def legacy_double_free(config: dict[str, Any], req: str = "") -> None:
    """vllm-spyre 0.3-0.4: when the first finished request (whose id starts with ``req``)
    gives its blocks back, its last block goes into the runner's free deque twice (breaks
    no_double_free and nothing else)."""
    cls = _runner_class()
    original = cls._update_states
    once = Once()

    def _update_states(self: Any, scheduler_output: Any) -> Any:
        victims = [r for r in scheduler_output.finished_req_ids
                   if str(r).startswith(req) and self.req_ids2blocks.get(r)]
        last = list(self.req_ids2blocks[victims[0]])[-1] if victims else None
        out = original(self, scheduler_output)
        if last is not None and once.due():
            self.free_blocks.append(last)
            once.fire(f"[hil] fault legacy_double_free fired: block {last} freed twice")
        return out

    cls._update_states = _update_states  # type: ignore[method-assign]


@fault("misname-dummy")
def misname_dummy(config: dict[str, Any]) -> None:
    """The legacy ledger adapter (harness.targets.spyre.ledger) no longer recognises the runner's
    padding dummy: its blocks are listed under an ordinary request id, so the ledger still
    adds up but no dummy is seen (a broken adapter, not a broken runner)."""
    ledger.LEGACY_DUMMY_ID = "padding"
    print("[hil] fault misname_dummy: the legacy dummy is listed as 'padding'", flush=True)


# -- the card


@fault("open-simulator")
def open_simulator(config: dict[str, Any]) -> None:
    """The engine's runtime opens the simulator instead of the leased card (FLEX_COMPUTE not
    SENTIENT, as the plugin's spyre_setup defaults it when unset), to prove the on-card
    verification fails on a simulator run."""
    os.environ["FLEX_COMPUTE"] = "SENULATOR"
    print("[hil] fault open-simulator: FLEX_COMPUTE=SENULATOR", flush=True)


@fault("registry-blocks-off")
def registry_blocks_off(config: dict[str, Any], by: int = -1) -> None:
    """sendnn-inference: the model configurator applies its registry entry's KV block count
    off by ``by`` (the entry declares N, the engine gets N + by), to prove the started engine
    is held to its entry."""
    from sendnn_inference.config.configurators import model_configurator  # the plugin's own

    by = int(by)
    cls = model_configurator.ModelConfigurator
    original = cls.configure

    def configure(self: Any, vllm_config: Any) -> Any:
        out = original(self, vllm_config)
        blocks = vllm_config.cache_config.num_gpu_blocks_override
        if blocks is not None:
            vllm_config.cache_config.num_gpu_blocks_override = blocks + by
            print(f"[hil] fault registry-blocks-off fired: {blocks} -> {blocks + by} blocks",
                  flush=True)
        return out

    cls.configure = configure  # type: ignore[method-assign]


@fault("open-other-card")
def open_other_card(config: dict[str, Any], address: str, of_rank: int = 0) -> None:
    """The runtime of rank ``of_rank`` (0: a one-card engine's) is pointed at another card
    than the leased one (its AIU_WORLD_RANK_<of_rank>, set in the engine process before its
    ranks start), to prove the on-card verification fails."""
    os.environ[f"AIU_WORLD_RANK_{of_rank}"] = address
    print(f"[hil] fault open-other-card: AIU_WORLD_RANK_{of_rank}={address}", flush=True)
