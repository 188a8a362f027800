"""Faults in sendnn-inference 2.x's batch TKV limit and prefix cache, for
``harness.in_engine.faults``: each breaks one exact step expectation of harness.checks.tkv or
harness.checks.prefix_reuse on the running engine.

The 2.x chunked-prefill scheduler (``ChunkedPrefillSpyreScheduler``) keeps batch size x TKV
within the batch TKV limit: with pausing on, ``_can_decode_all_requests`` judges each batch it
considers by the TKV it predicts for the next decode (``predict_next_decode_tkv``) and pauses
what does not fit; with pausing off, ``_satisfies_last_chunk_constraints`` holds a newcomer
back by a worst case over its whole output. The runner (``ChunkedPrefillModelRunner``) builds
each decode batch left-padded to whole blocks (``_prepare_decode``: its ``tkv``) and asserts
the limit itself. Prefix hits come from vLLM's KV cache manager (``get_computed_blocks``,
whole blocks); the request reports them as ``num_cached_tokens``.

Declared in ``SpyreTarget.fault_modules`` beside ``faults_2x.py``; like those, a fault here
refuses to install on another plugin generation, saying which one it needs.
"""

from __future__ import annotations

import sys
from typing import Any

from harness.in_engine.fault_registry import Once, armed, fault
from harness.targets.spyre.faults_2x import plugin_module, runner_class, scheduler_class

# -- pure parts (tests/unit/targets/spyre/test_faults_tkv_prefix.py)


def fits(batch_size: int, tkv: int, limit: int) -> bool:
    """Whether a batch of ``batch_size`` at ``tkv`` stays within the batch TKV ``limit``."""
    return batch_size * tkv <= limit


def dropped_last_block(groups: tuple[list[Any], ...], tokens: int,
                       block_size: int) -> tuple[tuple[list[Any], ...], int]:
    """A prefix hit (blocks per KV cache group, tokens) less its last block."""
    if tokens < block_size:
        return groups, tokens
    return tuple(list(g)[:-1] for g in groups), tokens - block_size


class _UnguardedPlatform:
    """The runner module's view of ``SpyrePlatform`` with the batch TKV limit lifted (the
    runner's own assertion of it); everything else is the platform's."""

    def __init__(self, platform: Any) -> None:
        self._platform = platform

    def __getattr__(self, name: str) -> Any:
        return getattr(self._platform, name)

    @staticmethod
    def get_max_batch_tkv_limit() -> int:
        return sys.maxsize


def lift_runner_guard(fault_name: str) -> None:
    """The runner asserts batch size x TKV within the limit before each forward pass (an
    assert: python -O strips it, and a card's compiled graph does not check); lift it so a
    step past the limit runs, and a check of the trace, not the assertion, has to see it."""
    module = plugin_module("v1.worker.spyre_model_runner", fault_name)
    if not isinstance(module.SpyrePlatform, _UnguardedPlatform):
        module.SpyrePlatform = _UnguardedPlatform(module.SpyrePlatform)


# -- pausing at the batch TKV limit


@fault("pause-one-step-late")
def pause_one_step_late(config: dict[str, Any]) -> None:
    """sendnn-inference 2.x, pausing on: the scheduler judges each batch it considers by the
    TKV of the step just run (the runner's last TKV) instead of the TKV its next decode will
    have, so where the TKV grows (a block edge: by a whole block) the batch decodes one step
    past the limit before a request is paused; the runner's own guard is lifted so the step
    runs (breaks tkv_limit)."""
    cls = scheduler_class("pause-one-step-late")
    lift_runner_guard("pause-one-step-late")
    original = cls._can_decode_all_requests
    once = Once()

    def _can_decode_all_requests(self: Any, decoding_requests: list[Any]) -> bool:
        if not armed() or not decoding_requests:
            return bool(original(self, decoding_requests))
        late = fits(len(decoding_requests), int(self.tkv), int(self.max_batch_tkv_limit))
        if late and not original(self, decoding_requests) and once.due():
            once.fire(f"[hil] fault pause_one_step_late fired: a batch of"
                      f" {len(decoding_requests)} judged by the last TKV {self.tkv}, not its"
                      f" next {self.predict_next_decode_tkv(decoding_requests)}")
        return late

    cls._can_decode_all_requests = _can_decode_all_requests  # type: ignore[method-assign]


@fault("pause-with-room")
def pause_with_room(config: dict[str, Any]) -> None:
    """sendnn-inference 2.x, pausing on: the scheduler judges each batch it considers by a TKV
    one block above the one it predicts, so it pauses requests while batch size x TKV would
    have stayed within the limit (breaks paused_with_room)."""
    cls = scheduler_class("pause-with-room")
    original = cls._can_decode_all_requests
    once = Once()

    def _can_decode_all_requests(self: Any, decoding_requests: list[Any]) -> bool:
        if not armed() or not decoding_requests:
            return bool(original(self, decoding_requests))
        tkv = int(self.predict_next_decode_tkv(decoding_requests)) + int(self.block_size)
        ok = fits(len(decoding_requests), tkv, int(self.max_batch_tkv_limit))
        if not ok and original(self, decoding_requests) and once.due():
            once.fire(f"[hil] fault pause_with_room fired: a batch of {len(decoding_requests)}"
                      f" judged at TKV {tkv}, one block above its next")
        return ok

    cls._can_decode_all_requests = _can_decode_all_requests  # type: ignore[method-assign]


@fault("tkv-prediction-without-padding")
def tkv_prediction_without_padding(config: dict[str, Any]) -> None:
    """sendnn-inference 2.x: the scheduler predicts a decode's TKV as its longest request's
    length, forgetting the whole pad blocks the runner puts before the shorter requests, so
    with requests of different block counts its prediction falls short of the runner's TKV
    (breaks tkv_prediction; with a limit that binds, the pause would also come late)."""
    cls = scheduler_class("tkv-prediction-without-padding")
    original = cls.predict_next_decode_tkv
    once = Once()

    def predict_next_decode_tkv(self: Any, running_requests: list[Any]) -> int:
        padded = int(original(self, running_requests))
        if not armed() or not running_requests:
            return padded
        bare = max(int(r.num_computed_tokens) + 1 for r in running_requests)
        if bare != padded and once.due():
            once.fire(f"[hil] fault tkv_prediction_without_padding fired: predicted {bare},"
                      f" not {padded}")
        return bare

    cls.predict_next_decode_tkv = predict_next_decode_tkv  # type: ignore[method-assign]


@fault("runner-tkv-one-block-high")
def runner_tkv_one_block_high(config: dict[str, Any]) -> None:
    """sendnn-inference 2.x: the runner's decode TKV (what it asserts the limit on and returns
    to the scheduler) is one block above what its batch's left padding gives, its model inputs
    unchanged (breaks runner_tkv, then tkv_prediction)."""
    cls = runner_class("runner-tkv-one-block-high")
    original = cls._prepare_decode
    once = Once()

    def _prepare_decode(self: Any, *a: Any, **kw: Any) -> Any:
        out = original(self, *a, **kw)
        if armed():
            self.tkv += int(self.block_size)
            if once.due():
                once.fire(f"[hil] fault runner_tkv_one_block_high fired: the runner's TKV is"
                          f" {self.tkv}")
        return out

    cls._prepare_decode = _prepare_decode  # type: ignore[method-assign]


# -- admission by the batch TKV limit


@fault("hold-back-at-admission")
def hold_back_at_admission(config: dict[str, Any]) -> None:
    """sendnn-inference 2.x, pausing on: admission applies the pausing-off rule anyway, the
    batch TKV limit over the newcomer's whole output at the batch's worst case, and holds a
    newcomer back although its joining now stays within the limit (pausing would keep it
    later) and the batch and the blocks have room (breaks held_back_with_room)."""
    module = plugin_module("v1.core.scheduler", "hold-back-at-admission")
    cls = module.ChunkedPrefillSpyreScheduler
    original = cls._satisfies_last_chunk_constraints
    envs = module.envs_spyre
    once = Once()

    class _PausingOff:
        def __getattr__(self, name: str) -> Any:
            if name == "SENDNN_INFERENCE_PAUSING_ENABLED":
                return False
            return getattr(envs, name)

    def _satisfies_last_chunk_constraints(self: Any, request: Any) -> bool:
        if not armed():
            return bool(original(self, request))
        module.envs_spyre = _PausingOff()
        try:
            ok = bool(original(self, request))
        finally:
            module.envs_spyre = envs
        if not ok and original(self, request) and once.due():
            once.fire(f"[hil] fault hold_back_at_admission fired: {request.request_id} held"
                      f" back by the worst-case batch TKV")
        return ok

    cls._satisfies_last_chunk_constraints = _satisfies_last_chunk_constraints  # type: ignore[method-assign]


# -- the prefix cache


def misreport_first_hit(name: str, blocks: int) -> None:
    """The first request served from the cache after start reports ``blocks`` blocks more
    cached tokens (fewer where negative) than it was served: vLLM's ``prefill_stats``, which
    its output's ``num_cached_tokens`` carries; what it ran is unchanged."""
    cls = scheduler_class(name)
    original = cls.schedule
    once = Once()
    said = name.replace("-", "_")

    def schedule(self: Any, *a: Any, **kw: Any) -> Any:
        out = original(self, *a, **kw)
        for new in out.scheduled_new_reqs:
            request = self.requests.get(new.req_id)
            stats = getattr(request, "prefill_stats", None)
            served = int(getattr(stats, "num_local_cached_tokens", 0) or 0)
            if stats is not None and served >= self.block_size and once.due():
                stats.set(num_prompt_tokens=stats.num_prompt_tokens,
                          num_local_cached_tokens=served + blocks * int(self.block_size),
                          num_external_cached_tokens=stats.num_external_cached_tokens)
                once.fire(f"[hil] fault {said} fired: {new.req_id} served"
                          f" {served} cached tokens, reports {stats.num_cached_tokens}")
        return out

    cls.schedule = schedule  # type: ignore[method-assign]


@fault("prefix-hit-underreported")
def prefix_hit_underreported(config: dict[str, Any]) -> None:
    """sendnn-inference 2.x with prefix caching: the first request served from the cache after
    start reports one block fewer cached tokens than it was served (vLLM's ``prefill_stats``,
    which its output's ``num_cached_tokens`` carries): it ran only the rest of its prompt, but
    its output says it computed a block more (breaks prefix_reuse: reports fewer cached tokens
    than it was served)."""
    misreport_first_hit("prefix-hit-underreported", -1)


@fault("prefix-hit-overreported")
def prefix_hit_overreported(config: dict[str, Any]) -> None:
    """sendnn-inference 2.x with prefix caching: the first request served from the cache after
    start reports one block more cached tokens than it was served: its output claims a block
    of its prompt came from the cache that it computed itself (breaks prefix_reuse: reports
    more cached tokens than it was served)."""
    misreport_first_hit("prefix-hit-overreported", 1)


@fault("prefix-cache-drops-a-block")
def prefix_cache_drops_a_block(config: dict[str, Any]) -> None:
    """sendnn-inference 2.x with prefix caching: the scheduler's view of the prefix cache
    (vLLM's ``get_computed_blocks`` on its KV cache manager) loses the last block of every hit,
    so a prompt served again computes a block the cache held, and reports that much less
    (breaks prefix_reuse: served fewer cached tokens than it shares)."""
    cls = scheduler_class("prefix-cache-drops-a-block")
    original_init = cls.__init__
    once = Once()

    def __init__(self: Any, *a: Any, **kw: Any) -> None:
        original_init(self, *a, **kw)
        manager = self.kv_cache_manager
        lookup = manager.get_computed_blocks
        block_size = int(self.block_size)

        def get_computed_blocks(request: Any) -> Any:
            blocks, tokens, *rest = lookup(request)
            if not armed() or tokens < block_size:
                return (blocks, tokens, *rest)
            groups, left = dropped_last_block(tuple(blocks.blocks), tokens, block_size)
            if once.due():
                once.fire(f"[hil] fault prefix_cache_drops_a_block fired: {request.request_id}"
                          f" hit {tokens} tokens, the scheduler sees {left}")
            return (manager.create_kv_cache_blocks(groups), left, *rest)

        manager.get_computed_blocks = get_computed_blocks

    cls.__init__ = __init__  # type: ignore[method-assign]
