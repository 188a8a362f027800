"""Faults in vLLM's KV block accounting: its ``BlockPool`` and its KV cache managers.

Most break exactly one KV ledger invariant first (harness/checks/ledger.py): a block
dropped at a free, the pad block or a block freed twice, a reference too many, a finished
request's blocks kept, and requests given one block too many or too few.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.in_engine.fault_registry import LEDGER_POOL, Once, armed, fault, run_target_hook


@fault("forget-free")
def forget_free(config: dict[str, Any], after: str = "0") -> None:
    """The ``after``-th time (0-based) a request's blocks go back to vLLM's BlockPool once
    the engine has started, one block is dropped: neither free nor owned any more."""
    from vllm.v1.core.block_pool import BlockPool  # defers a heavy import

    original = BlockPool.free_blocks
    once = Once(after)

    def free_blocks(self: Any, ordered_blocks: Any) -> None:
        blocks = list(ordered_blocks)
        if blocks and once.due():
            once.fire(f"[hil] fault forget_free fired: block {blocks[-1].block_id} not freed")
            blocks = blocks[:-1]
        return original(self, blocks)

    BlockPool.free_blocks = free_blocks  # type: ignore[method-assign]


def _drop_a_block_on_free(config: dict[str, Any], name: str, once: Once | None) -> None:
    """Patch vLLM's ``BlockPool.free_blocks`` on the ledger pool (the one holding a request's
    real blocks: a target hook may name it, else it is vLLM's only pool): the last block of
    the request being freed is neither freed nor owned any more, every time or ``once``."""
    from vllm.v1.core.block_pool import BlockPool  # defers a heavy import

    is_ledger: Callable[[Any], bool] | None = run_target_hook(LEDGER_POOL, config)
    original = BlockPool.free_blocks

    def free_blocks(self: Any, ordered_blocks: Any) -> None:
        blocks = list(ordered_blocks)
        ledger = is_ledger is None or is_ledger(self)
        if armed() and ledger and blocks and (once is None or once.due()):
            line = f"[hil] fault {name} fired: block {blocks[-1].block_id} not freed"
            if once is None:
                print(line, flush=True)
            else:
                once.fire(line)
            blocks = blocks[:-1]
        return original(self, blocks)

    BlockPool.free_blocks = free_blocks  # type: ignore[method-assign]


@fault("forget-free-once")
def forget_free_once(config: dict[str, Any]) -> None:
    """Once per pytest process (not per engine): the first request whose blocks go back to the
    ledger pool keeps one. A replacement engine started later in the run does not leak, so only
    the test whose scenario ran first on the faulty configuration leaks."""
    _drop_a_block_on_free(config, "forget_free_once", Once(state_key="forget-free-once"))


@fault("forget-free-each")
def forget_free_each(config: dict[str, Any]) -> None:
    """Every request whose blocks go back to the ledger pool keeps one (a free that always
    forgets its last block): every test that frees blocks leaks in its own scenario."""
    _drop_a_block_on_free(config, "forget_free_each", None)


def _after_first_armed_free(action: Callable[[Any, list[Any]], str | None]) -> None:
    """Wrap vLLM's ``BlockPool.free_blocks``: after the first armed call that frees a block,
    run ``action(pool, freed)`` once; it returns the line to print (None: not yet)."""
    from vllm.v1.core.block_pool import BlockPool  # defers a heavy import

    original = BlockPool.free_blocks
    once = Once()

    def free_blocks(self: Any, ordered_blocks: Any) -> None:
        blocks = list(ordered_blocks)
        out = original(self, blocks)
        if blocks and once.due():
            line = action(self, blocks)
            if line:
                once.fire(line)
        return out

    BlockPool.free_blocks = free_blocks  # type: ignore[method-assign]


@fault("free-pad-block")
def free_pad_block(config: dict[str, Any]) -> None:
    """The first time blocks go back to vLLM's pool after start, its pad (null) block is put
    in the free list too: breaks pad_never_owned and nothing else."""

    def action(pool: Any, freed: list[Any]) -> str:
        pool.free_block_queue.append(pool.null_block)
        return f"[hil] fault free_pad_block fired: pad block {pool.null_block.block_id} in the free list"

    _after_first_armed_free(action)


@fault("refree-block")
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


@fault("extra-ref")
def extra_ref(config: dict[str, Any]) -> None:
    """The first block vLLM's pool hands out after start gets one reference too many (a
    holder counted twice): breaks ref_counts while it is held, before the block that
    never reaches ref count 0 again leaks at its free."""
    from vllm.v1.core.block_pool import BlockPool  # defers a heavy import

    original = BlockPool.get_new_blocks
    once = Once()

    def get_new_blocks(self: Any, num_blocks: int) -> Any:
        blocks = original(self, num_blocks)
        if blocks and once.due():
            blocks[0].ref_cnt += 1
            once.fire(f"[hil] fault extra_ref fired: block {blocks[0].block_id} ref count"
                      f" {blocks[0].ref_cnt}")
        return blocks

    BlockPool.get_new_blocks = get_new_blocks  # type: ignore[method-assign]


@fault("keep-finished-blocks")
def keep_finished_blocks(config: dict[str, Any]) -> None:
    """vLLM's scheduler does not free the blocks of the first request that finishes after
    start: they stay owned by a request that no longer exists (every per-step invariant
    holds; idle_all_free breaks at idle)."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager  # defers a heavy import

    original = KVCacheManager.free
    once = Once()

    def free(self: Any, request: Any) -> None:
        if once.due():
            once.fire(f"[hil] fault keep_finished_blocks fired: {request.request_id} keeps its"
                      " blocks")
            return None
        return original(self, request)

    KVCacheManager.free = free  # type: ignore[method-assign]


@fault("block-too-many")
def block_too_many(config: dict[str, Any]) -> None:
    """vLLM takes one KV block more from the pool for every request than its tokens need:
    admission counts it, the request holds it until its blocks are freed (finish or
    preemption), and the model runner never sees it (its block table stays as wide as
    max_model_len needs), as an allocator that rounds up once too often would."""
    # defers a heavy import
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


def _size_requests_as(tokens: Callable[[Any, str, int], int]) -> None:
    """Patch vLLM's KV cache managers so that a request is sized, at admission and at every
    allocation, as if it held ``tokens(manager, request_id, num_tokens)`` tokens."""
    # defers a heavy import
    from vllm.v1.core.single_type_kv_cache_manager import SingleTypeKVCacheManager

    cls = SingleTypeKVCacheManager
    count, allocate = cls.get_num_blocks_to_allocate, cls.allocate_new_blocks

    def get_num_blocks_to_allocate(self: Any, request_id: str, num_tokens: int,
                                   *a: Any, **kw: Any) -> int:
        return count(self, request_id, tokens(self, request_id, num_tokens), *a, **kw)

    def allocate_new_blocks(self: Any, request_id: str, num_tokens: int,
                            *a: Any, **kw: Any) -> Any:
        return allocate(self, request_id, tokens(self, request_id, num_tokens), *a, **kw)

    cls.get_num_blocks_to_allocate = get_num_blocks_to_allocate  # type: ignore[method-assign]
    cls.allocate_new_blocks = allocate_new_blocks  # type: ignore[method-assign]


@fault("block-too-few")
def block_too_few(config: dict[str, Any]) -> None:
    """vLLM gives every request one KV block fewer than its tokens need, at admission and at
    every allocation (its last block's keys and values go wherever the runner's block table
    holds a stale entry)."""
    said = Once()  # the damage is done every time; the log line is printed once

    def fewer(self: Any, request_id: str, num_tokens: int) -> int:
        if not armed() or num_tokens <= 0:
            return num_tokens
        if said.due():
            said.fire(f"[hil] fault block_too_few fired: requests sized one block of"
                      f" {self.block_size} tokens short")
        return max(num_tokens - int(self.block_size), 0)

    _size_requests_as(fewer)


@fault("block-too-many-at-edge")
def block_too_many_at_edge(config: dict[str, Any]) -> None:
    """vLLM sizes a request one KV block too big whenever its token count is an exact multiple
    of the block size (``num_tokens // block_size + 1`` for ``cdiv``), at admission and at every
    allocation: the block is used once the request grows a token, so nothing leaks and a
    request whose length never stops on a block's edge holds exactly what it needs."""
    said = Once()  # the damage is done at every edge; the log line is printed once

    def at_edge(self: Any, request_id: str, num_tokens: int) -> int:
        if not armed() or num_tokens <= 0 or num_tokens % int(self.block_size):
            return num_tokens
        if said.due():
            said.fire(f"[hil] fault block_too_many_at_edge fired: {request_id} at {num_tokens}"
                      f" tokens sized one {self.block_size}-token block too big")
        return num_tokens + 1

    _size_requests_as(at_edge)
