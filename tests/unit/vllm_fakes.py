"""Fake engine objects for the KV ledger probes: the block pool, its free queue, the KV
cache managers, the scheduler and the Spyre model runners.

The fakes mirror the attribute names of vLLM 0.17.1 (``KVCacheBlock``,
``FreeKVCacheBlockQueue``, ``BlockPool``, ``KVCacheManager``), vllm-spyre 1.10
(``ContinuousBatchingSpyreModelRunner``, ``ChunkedPrefillModelRunner``) and
vllm-spyre 0.4.0 (the legacy continuous-batching runner).
"""

from __future__ import annotations

from collections import defaultdict, deque
from types import SimpleNamespace
from typing import Any


class FakeBlock:
    """Mirrors vllm.v1.core.kv_cache_utils.KVCacheBlock."""

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.is_null = False
        self.prev_free_block: FakeBlock | None = None
        self.next_free_block: FakeBlock | None = None


class FakeFreeQueue:
    """Mirrors FreeKVCacheBlockQueue: a doubly linked list between fake head and tail."""

    def __init__(self, blocks: list[FakeBlock]) -> None:
        self.num_free_blocks = len(blocks)
        self.fake_free_list_head = FakeBlock(-1)
        self.fake_free_list_tail = FakeBlock(-1)
        chain = [self.fake_free_list_head, *blocks, self.fake_free_list_tail]
        for a, b in zip(chain, chain[1:], strict=False):
            a.next_free_block, b.prev_free_block = b, a

    def popleft(self) -> FakeBlock:
        raise AssertionError("a snapshot must not pop the free queue")

    def get_all_free_blocks(self) -> list[FakeBlock]:
        raise AssertionError("the adapter walks the links itself")


def fake_pool(
    num_blocks: int,
    owned: dict[str, list[int]],
    free_order: list[int] | None = None,
    caching: bool = False,
) -> SimpleNamespace:
    """A BlockPool with block 0 as null block, ``owned`` allocated, the rest free."""
    blocks = [FakeBlock(i) for i in range(num_blocks)]
    blocks[0].is_null = True
    held = {b for ids in owned.values() for b in ids}
    for ids in owned.values():
        for b in ids:
            blocks[b].ref_cnt += 1
    if free_order is None:
        free_order = [i for i in range(1, num_blocks) if i not in held]
    return SimpleNamespace(
        blocks=blocks,
        free_block_queue=FakeFreeQueue([blocks[i] for i in free_order]),
        null_block=blocks[0],
        enable_caching=caching,
    )


def fake_manager(
    pool: SimpleNamespace, owned: dict[str, list[int]], block_size: int, **attrs: Any
) -> SimpleNamespace:
    """A SingleTypeKVCacheManager: ``req_to_blocks`` is a defaultdict(list) of blocks."""
    req_to_blocks: defaultdict[str, list[FakeBlock]] = defaultdict(list)
    for req_id, ids in owned.items():
        req_to_blocks[req_id] = [pool.blocks[i] for i in ids]
    return SimpleNamespace(
        req_to_blocks=req_to_blocks, block_pool=pool, block_size=block_size, **attrs
    )


def fake_vllm_scheduler(pool: SimpleNamespace, *managers: SimpleNamespace) -> SimpleNamespace:
    coordinator = SimpleNamespace(single_type_managers=tuple(managers), block_pool=pool)
    return SimpleNamespace(
        kv_cache_manager=SimpleNamespace(coordinator=coordinator, block_pool=pool)
    )


class FakeCBRunner:
    """Mirrors ContinuousBatchingSpyreModelRunner's block bookkeeping."""

    def __init__(
        self, num_blocks: int, owned: dict[str, list[int]], reserved: dict[str, int]
    ) -> None:
        self.block_size = 64
        self.n_blocks = num_blocks - 1
        self.block_pool = fake_pool(num_blocks, owned)
        self.kv_cache_manager = fake_manager(self.block_pool, owned, self.block_size)
        self.req_ids2num_reserved_blocks = dict(reserved)
        self.tkv = 129

    def get_n_free_blocks(self) -> int:
        return self.n_blocks - sum(self.req_ids2num_reserved_blocks.values())


class FakeCPRunner(FakeCBRunner):
    """Mirrors ChunkedPrefillModelRunner: no reservations, reports the pool's count."""

    def __init__(self, num_blocks: int, owned: dict[str, list[int]]) -> None:
        super().__init__(num_blocks, owned, {})
        self.chunk_size = 128
        self.chunk_blocks_count = 2

    def get_n_free_blocks(self) -> int:
        return self.kv_cache_manager.block_pool.free_block_queue.num_free_blocks


class FakeLegacyRunner:
    """Mirrors vllm-spyre 0.4.0's ContinuousBatchingSpyreModelRunner."""

    def __init__(self, num_blocks: int) -> None:
        self.BLOCK_SIZE = 64
        self.free_blocks: deque[int] = deque(range(num_blocks))
        self.req_ids2blocks: dict[str, deque[int]] = {}
        self.req_ids2left_pads: dict[str, int] = {}
        self.dummy_req_ids2blocks: list[int] = []
        self.tkv = 0
        kv_tensor = SimpleNamespace(shape=(num_blocks, 64, 2, 32))
        self.model = SimpleNamespace(
            model=SimpleNamespace(past_key_value_states=[(kv_tensor, kv_tensor)])
        )


def engine_core(scheduler: Any, runner: Any) -> SimpleNamespace:
    worker = SimpleNamespace(model_runner=runner)
    return SimpleNamespace(
        scheduler=scheduler,
        model_executor=SimpleNamespace(driver_worker=SimpleNamespace(worker=worker)),
    )
