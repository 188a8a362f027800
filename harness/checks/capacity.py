"""Preflight: how many KV blocks a configuration needs, checked before a run.

A full-length request (max_model_len tokens) needs ceil(max_model_len / block_size)
blocks; a full batch needs max_num_seqs of those; and the pool keeps one block
(block 0) as the pad/null block that no request may hold. So a pool of exactly
``max_num_seqs`` full-length blocks serves only ``max_num_seqs - 1`` requests:
the Neuron geometry (block_size == max_model_len) needs ``max_num_seqs + 1``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from harness.core.config import ConfigError, EngineConfig
from harness.core.verdict import CAPACITY, Verdict

PAD_BLOCKS = 1


class CapacityError(ConfigError):
    """The KV block count cannot serve one full-length request."""


@dataclass(frozen=True)
class BlockNeed:
    block_size: int
    max_model_len: int
    max_num_seqs: int
    per_request: int
    pad_blocks: int

    @property
    def one_request(self) -> int:
        """Blocks without which not even one full-length request can run."""
        return self.per_request + self.pad_blocks

    @property
    def full_batch(self) -> int:
        """Blocks for max_num_seqs full-length requests at once, without preemption."""
        return self.max_num_seqs * self.per_request + self.pad_blocks

    def explain(self) -> str:
        return (
            f"a full-length request ({self.max_model_len} tokens) needs"
            f" ceil({self.max_model_len}/{self.block_size}) = {self.per_request} blocks of"
            f" {self.block_size} tokens, plus {self.pad_blocks} pad/null block"
        )


def blocks_needed(
    max_model_len: int, max_num_seqs: int, block_size: int, pad_blocks: int = PAD_BLOCKS
) -> BlockNeed:
    """The block need of a configuration (per request, per full batch, with the pad block)."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    return BlockNeed(
        block_size=block_size,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        per_request=math.ceil(max_model_len / block_size),
        pad_blocks=pad_blocks,
    )


def preflight(need: BlockNeed, num_blocks: int, source: str) -> None:
    """Raise CapacityError when ``num_blocks`` cannot serve one full-length request.

    ``source`` says where the count came from (an override, the device's profile).
    """
    if num_blocks < need.one_request:
        raise CapacityError(
            f"KV cache too small: {num_blocks} blocks ({source}) cannot serve one"
            f" full-length request: {need.explain()} = {need.one_request} blocks;"
            f" a full batch of {need.max_num_seqs} needs {need.full_batch}."
            f" Set num_gpu_blocks_override to at least {need.one_request}"
            f" ({need.full_batch} for a full batch without preemption)"
        )


def full_batch_shortfall(need: BlockNeed, num_blocks: int) -> str | None:
    """Why ``num_blocks`` cannot hold a full batch without preemption, or None."""
    if num_blocks >= need.full_batch:
        return None
    return (
        f"{num_blocks} blocks cannot hold {need.max_num_seqs} full-length requests at once:"
        f" {need.explain()}, so a full batch needs {need.max_num_seqs} x {need.per_request}"
        f" + {need.pad_blocks} = {need.full_batch}"
    )


def preflight_config(cfg: EngineConfig) -> None:
    """Refuse, before start, an override that cannot serve one full-length request.

    Called where the stack does not check it itself (a kind that does says
    ``refuses_small_pool``): vLLM 0.17 accepts any ``num_gpu_blocks_override``.
    """
    if cfg.num_blocks_override is None or cfg.block_size is None:
        return
    need = blocks_needed(cfg.max_model_len, cfg.max_num_seqs, cfg.block_size)
    preflight(need, cfg.num_blocks_override, "num_gpu_blocks_override")


@dataclass(frozen=True)
class KvPool:
    """The KV pool an engine decided on, from the ledger it reported at start.

    ``num_blocks`` is the pool's (the ledger's) block count; ``device_blocks`` how many blocks
    the KV cache tensors the device allocated really hold (``KvSnapshot.device_blocks``),
    None where the engine's ledger does not read them.
    """

    num_blocks: int
    block_size: int
    pad_blocks: int
    source: str
    device_blocks: int | None = None

    @classmethod
    def from_engine_info(cls, info: dict[str, Any]) -> KvPool | None:
        """None when the engine reported no readable ledger (``kv_error`` says why)."""
        n, size = info.get("kv_num_blocks"), info.get("kv_block_size")
        if not n or not size:
            return None
        device = info.get("kv_device_blocks")
        return cls(num_blocks=int(n), block_size=int(size),
                   pad_blocks=int(info.get("kv_pad_blocks", PAD_BLOCKS)),
                   source=str(info.get("kv_source")),
                   device_blocks=None if device is None else int(device))


def check_pool_serves_full_batch(need: BlockNeed, num_blocks: int) -> Verdict:
    """``num_blocks`` serve one full-length request and a full batch without preemption."""
    if num_blocks < need.one_request:
        why = (f"KV cache too small: {num_blocks} blocks cannot serve one full-length request:"
               f" {need.explain()} = {need.one_request} blocks")
        return Verdict.failed(CAPACITY, why)
    short = full_batch_shortfall(need, num_blocks)
    if short is not None:
        return Verdict.failed(CAPACITY, f"KV cache too small for a full batch: {short}")
    return Verdict.passed(CAPACITY, f"{num_blocks} blocks >= {need.full_batch} for a full batch")


def _held_shortfall(need: BlockNeed, num_blocks: int, holder: str) -> str | None:
    """Why ``num_blocks`` held by ``holder`` cannot serve ``need``'s full batch, or None."""
    if num_blocks < need.one_request:
        return (f"KV cache too small: {holder} {num_blocks} blocks, which cannot serve one"
                f" full-length request: {need.explain()} = {need.one_request} blocks")
    short = full_batch_shortfall(need, num_blocks)
    if short is None:
        return None
    return f"KV cache too small for a full batch: {holder} {num_blocks} blocks; {short}"


def check_engine_serves_full_batch(need: BlockNeed, pool: KvPool) -> Verdict:
    """The blocks the engine really holds serve a full batch without preemption: the KV cache
    the device allocated (``pool.device_blocks``: its tensors' block count) and the pool the
    scheduler hands blocks out of (``pool.num_blocks``), each against ``need``; the device
    first, since a pool larger than it hands out blocks that do not exist. Where the ledger
    does not read the device's cache the pool alone is judged, and the verdict says so."""
    held = [("the device allocated", pool.device_blocks), ("the scheduler's pool has",
                                                           pool.num_blocks)]
    for holder, n in held:
        if n is not None and (why := _held_shortfall(need, n, holder)) is not None:
            return Verdict.failed(CAPACITY, why)
    if pool.device_blocks is None:
        return Verdict.passed(CAPACITY, f"the pool's {pool.num_blocks} blocks >="
                              f" {need.full_batch} for a full batch (the device's KV cache is"
                              f" not read on this engine: {pool.source})")
    return Verdict.passed(CAPACITY, f"the device's {pool.device_blocks} blocks and the pool's"
                          f" {pool.num_blocks} >= {need.full_batch} for a full batch")


def check_capacity(cfg: EngineConfig, info: dict[str, Any]) -> None:
    """After start: the block count the device decided must serve one full-length request."""
    pool = KvPool.from_engine_info(info)
    if pool is None:
        return
    need = blocks_needed(int(info.get("max_model_len", cfg.max_model_len)), cfg.max_num_seqs,
                         pool.block_size, pad_blocks=pool.pad_blocks)
    preflight(need, pool.num_blocks, f"reported by the {cfg.label} engine ({pool.source})")


FILLED = f"{CAPACITY}.filled"


def check_reservations_fill_pool(trace: Any, max_num_seqs: int) -> Verdict:
    """At the first step with ``max_num_seqs`` requests running, the runner reports no free
    block: the batch's reservations take the whole pool, so the run tests the pool's edge
    (a block more for any request would have held it back)."""
    for step in trace.steps:
        if len(step.running) < max_num_seqs:
            continue
        free = [s.reported_free for s in step.kv if s.reported_free is not None]
        if not free:
            return Verdict.failed(FILLED, f"step {step.step}: no ledger reports a"
                                  " free count (a continuous-batching runner's reservations)")
        if free[0] != 0:
            return Verdict.failed(
                FILLED,
                f"step {step.step}: the full batch left {free[0]} of the pool's blocks"
                " unreserved, so the run does not test the pool's edge",
                at=step.step)
        return Verdict.passed(FILLED, "the full batch reserved every usable block"
                              f" from step {step.step}")
    return Verdict.failed(FILLED, f"no step ran {max_num_seqs} requests at once")
