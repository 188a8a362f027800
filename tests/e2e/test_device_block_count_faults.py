"""The block count is the device's: faults that make the KV cache a running engine allocated
disagree with the pool its scheduler hands blocks out of, or that make the device-decided
count too small for a full batch, fail the suites with the right check, category and message.

``device_blocks`` (harness/checks/device_blocks.py) compares the pool with the block count of
the KV cache tensors the model runner allocated, read from their shapes at every step:
a runner that allocates a block fewer than its pool (``runner-kv-short`` on sendnn-inference
2.x, ``kv-cache-short`` on vLLM's own runner) breaks it from the snapshot after start-up, a
defect, filed as a block leak. The capacity suite judges what the engine really holds: a
runner two blocks short (its pool still a full batch's) and a plugin whose block-count
formula forgets the pad block (pool and cache agree, both short) fail
``test_device_decided_block_count_serves_a_full_batch`` as capacity, naming the device's count.

Each child pytest proves one fault per target variant (``variant=ID``), one engine per test.
"""

import re

import pytest

from harness.core.trace import SOURCE_VLLM_SCHEDULER
from tests.e2e.test_spyre2_faults import run_faults

pytestmark = pytest.mark.e2e  # each test runs a suite in a child pytest with engines

FREEING = "suites/test_block_freeing.py"
CAPACITY = "suites/test_capacity.py"
CP, PC, CPU = "spyre-eager-cp", "spyre-eager-pc", "vllm-cpu"
DEFECT = re.compile(r"the pool has (\d+) blocks but the device's KV cache holds (\d+) \(ids 0\.\.\d+\):"
                    r" the scheduler can hand out blocks \[(\d+)\], which do not exist on the"
                    r" device \(a defect: their KV is written out of bounds\)")


def failed_as(run, variant: str, check: str, category: str, *phrases: str) -> str:
    """The test of ``variant`` failed on ``check``, filed as ``category``, its message holding
    every phrase; returns the message."""
    name = run.named(f"-{variant}")
    message = run.messages.get(name, "")
    assert run.check(name) == check, message[:2000]
    assert run.category(name) == category, message[:2000]
    for phrase in phrases:
        assert phrase in message, message[:3000]
    return message


def test_a_runner_allocating_a_block_fewer_than_its_pool_breaks_device_blocks(tmp_path):
    """spyre-eager-cp (2.x's runner) and vllm-cpu (vLLM's): the KV cache holds one block
    fewer than the scheduler's pool, so the pool's highest block does not exist on the device:
    device_blocks from the snapshot after start-up, once, as a block leak."""
    run = run_faults(tmp_path, FREEING, "single-request",
                     {CP: "runner-kv-short", CPU: "kv-cache-short"})
    for variant in (CP, CPU):
        message = failed_as(run, variant, "kv_ledger.device_blocks", "block leak",
                            "kv invariant device_blocks broken at step -1:",
                            f"[device_blocks] {SOURCE_VLLM_SCHEDULER}:",
                            "invariants broken: device_blocks", "1 violation(s):")
        pool, device, missing = map(int, DEFECT.search(message).groups())
        assert pool == device + 1 == missing + 1, message[:1000]


def test_the_capacity_suite_judges_the_kv_cache_the_engine_allocated(tmp_path):
    """test_device_decided_block_count_serves_a_full_batch, as capacity before the run.
    spyre-eager-pc: the runner allocates two blocks fewer than the plugin decided (the pool
    still holds a full batch: 10 blocks; the cache 8). spyre-eager-cp: the plugin's formula
    forgets the pad block, so pool and cache agree on 8. vllm-cpu: the harness-sized pool is
    exactly a full batch (33), its cache a block short."""
    run = run_faults(tmp_path, CAPACITY, "device_decided",
                     {PC: "runner-kv-short:by=2", CP: "formula-forgets-pad-block",
                      CPU: "kv-cache-short"})
    spyre_full = ("8 blocks cannot hold 2 full-length requests at once: a full-length request"
                  " (256 tokens) needs ceil(256/64) = 4 blocks of 64 tokens, plus 1 pad/null"
                  " block, so a full batch needs 2 x 4 + 1 = 9")
    for variant in (PC, CP):
        failed_as(run, variant, "capacity", "capacity",
                  "[check capacity] KV cache too small for a full batch: the device allocated 8"
                  " blocks; " + spyre_full)
    failed_as(run, CPU, "capacity", "capacity",
              "[check capacity] KV cache too small for a full batch: the device allocated 32"
              " blocks; 32 blocks cannot hold 2 full-length requests at once")
