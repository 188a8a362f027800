"""What the engine really holds against a full batch (harness/checks/capacity.py:
``check_engine_serves_full_batch``): the KV cache the device allocated and the scheduler's
pool, each judged; the engine's report read into ``KvPool``."""

from __future__ import annotations

from harness.checks.capacity import KvPool, blocks_needed, check_engine_serves_full_batch
from harness.core.verdict import CAPACITY
from harness.report.categories import classify

# Two full-length requests of 256 tokens in 64-token blocks: 2 x 4 + the pad block = 9.
NEED = blocks_needed(256, 2, 64)


def pool(num_blocks=10, device=10):
    return KvPool(num_blocks=num_blocks, block_size=64, pad_blocks=1, source="vllm-scheduler",
                  device_blocks=device)


def test_a_device_and_a_pool_that_hold_a_full_batch_pass():
    verdict = check_engine_serves_full_batch(NEED, pool(10, 10))
    assert verdict.ok and verdict.why == ("the device's 10 blocks and the pool's 10 >= 9 for a"
                                          " full batch")


def test_a_device_short_of_the_full_batch_fails_though_the_pool_is_large_enough():
    verdict = check_engine_serves_full_batch(NEED, pool(10, 8))
    assert not verdict.ok and verdict.check == CAPACITY
    assert verdict.why == ("KV cache too small for a full batch: the device allocated 8 blocks;"
                           " 8 blocks cannot hold 2 full-length requests at once: a full-length"
                           " request (256 tokens) needs ceil(256/64) = 4 blocks of 64 tokens,"
                           " plus 1 pad/null block, so a full batch needs 2 x 4 + 1 = 9")
    first = f"harness.core.verdict.VerdictFailed: [check {verdict.check}] {verdict.why}"
    assert classify("failed", first) == "capacity"


def test_a_pool_short_of_the_full_batch_fails_though_the_device_holds_it():
    verdict = check_engine_serves_full_batch(NEED, pool(8, 10))
    assert not verdict.ok
    assert verdict.why.startswith("KV cache too small for a full batch: the scheduler's pool has"
                                  " 8 blocks; 8 blocks cannot hold 2")


def test_a_device_below_one_request():
    verdict = check_engine_serves_full_batch(NEED, pool(10, 4))
    assert verdict.why == ("KV cache too small: the device allocated 4 blocks, which cannot"
                           " serve one full-length request: a full-length request (256 tokens)"
                           " needs ceil(256/64) = 4 blocks of 64 tokens, plus 1 pad/null block"
                           " = 5 blocks")


def test_where_the_device_is_not_read_the_pool_alone_is_judged_and_said():
    ok = check_engine_serves_full_batch(NEED, pool(9, None))
    assert ok.ok and "the device's KV cache is not read on this engine" in ok.why
    assert not check_engine_serves_full_batch(NEED, pool(8, None)).ok


def test_the_engines_report_carries_the_device_count():
    info = {"kv_num_blocks": 10, "kv_block_size": 64, "kv_pad_blocks": 1,
            "kv_source": "vllm-scheduler", "kv_device_blocks": 9}
    assert KvPool.from_engine_info(info) == pool(10, 9)
    del info["kv_device_blocks"]
    assert KvPool.from_engine_info(info).device_blocks is None
