"""Block boundaries: a request holds exactly the blocks its tokens fill.

A request with N tokens in the KV cache (its prompt and the outputs fed back so far: what
the model executor has run for it since it last started) needs ceil(N / block_size)
blocks. One block too many at an exact multiple of the block size (an off-by-one in a
``cdiv``), or one too few a token past it, keeps the ledger whole (every block is free,
owned or pad) and leaks nothing at idle; it only shows when a pool sized exactly for the
batch runs out, as a preemption, or as a capacity failure. This check reads it at every
step, from vLLM's scheduler pool, for every request that pool says owns blocks, and names
the class in its message.

It applies where blocks follow tokens one to one: vLLM's own pool without prefix caching
(shared prefix blocks are owned by several requests) and without left padding (the Spyre
runners pad a request's blocks on the left).
"""

from __future__ import annotations

import math

from harness.core.trace import SOURCE_VLLM_SCHEDULER, Trace, is_dummy_id
from harness.core.verdict import KV_LEDGER, Verdict

BLOCK_BOUNDARY = f"{KV_LEDGER}.block_boundary"


def check_blocks_follow_tokens(trace: Trace, block_size: int) -> Verdict:
    """After every step, each request owns ceil(tokens / block_size) blocks of the scheduler's
    pool, its tokens being what the executor ran for it since its last (re)start."""
    ran: dict[str, int] = {}
    checked = 0
    for step in trace.steps:
        for rid in step.preempted:  # its blocks are freed; it recomputes from the start
            ran[rid] = 0
        for rid, n in step.executed.items():
            ran[rid] = ran.get(rid, 0) + n
        pool = next((s for s in step.kv if s.source == SOURCE_VLLM_SCHEDULER), None)
        if pool is None:
            continue
        for rid, blocks in sorted(pool.owned.items()):
            if is_dummy_id(rid) or rid in pool.dummy_ids:
                continue
            tokens = ran.get(rid, 0)
            need = math.ceil(tokens / block_size)
            checked += 1
            if len(blocks) == need:
                continue
            off = len(blocks) - need
            what = (f"{off} block{'s' if abs(off) > 1 else ''} too many" if off > 0
                    else f"{-off} block{'s' if off < -1 else ''} too few")
            edge = ("an exact multiple of" if tokens % block_size == 0
                    else f"{tokens % block_size} past a multiple of")
            why = (f"block boundary: after step {step.step} request {rid} holds {len(blocks)}"
                   f" blocks {blocks} for {tokens} tokens in the KV cache, ceil({tokens}/"
                   f"{block_size}) = {need} needed: {what} at {edge} the {block_size}-token"
                   " block")
            return Verdict.failed(BLOCK_BOUNDARY, why, at=step.step)
    if not checked:
        return Verdict.failed(BLOCK_BOUNDARY, "block boundary: no step showed a request owning"
                              " blocks in vLLM's scheduler pool (nothing was checked)")
    return Verdict.passed(BLOCK_BOUNDARY, f"every request held ceil(tokens/{block_size}) blocks"
                          f" ({checked} request-steps)")
