"""The engine shapes a Spyre card compiles: what a continuous-batching engine on the sendnn
backend may be started with, and the smallest such shape for a test's limits.

A card compiles its graphs at start for the engine's context, batch and prefill chunk (the
plugin hands them to the runtime as ``VLLM_DT_MAX_CONTEXT_LEN``, ``VLLM_DT_MAX_BATCH_SIZE`` and
``VLLM_DT_CHUNK_LEN``). The rules, as upstream's own suite starts every engine it runs on cards
(sendnn-inference ``tests/llm_cache.py``: a context under 512 "can cause compilation failures on
spyre hardware"; the batch rounded up to a power of two, at least 4), with the plugin's own
limits (a chunk a multiple of its 64-token block; 32K the longest context it supports for
continuous batching). The same rules are the ``card`` geometry's (fixtures/geometries.toml).

Static batching (vllm-spyre 1.x ``sb``) compiles one fixed graph per warmup shape, whose
lengths the plugin checks itself (multiples of 64): these rules are not its.
"""

from __future__ import annotations

from dataclasses import replace

from harness.scenario.prompts import EngineLimits

BLOCK = 64          # the plugin's KV block, in tokens
MIN_CONTEXT = 512   # a context under this can fail to compile
MAX_CONTEXT = 32 * 1024
MIN_BATCH = 4       # a batch of a power of two, at least this
RULES = (f"a context of {MIN_CONTEXT} to {MAX_CONTEXT} tokens in whole {BLOCK}-token blocks, a"
         f" batch that is a power of two of at least {MIN_BATCH}, a prefill chunk in whole"
         f" {BLOCK}-token blocks")


def compiles_shapes(backend: str | None, mode: str | None) -> bool:
    """Whether an engine of this backend and mode is held to these rules: continuous batching
    on a card (sendnn); static batching compiles its warmup shapes."""
    return backend == "sendnn" and mode != "sb"


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def shape_problems(max_model_len: int, max_num_seqs: int, chunk: int | None) -> list[str]:
    """What in this engine shape a card does not compile (empty: it compiles)."""
    out = []
    if max_model_len < MIN_CONTEXT:
        out.append(f"context {max_model_len} is under {MIN_CONTEXT}")
    elif max_model_len > MAX_CONTEXT:
        out.append(f"context {max_model_len} is over {MAX_CONTEXT}")
    elif max_model_len % BLOCK:
        out.append(f"context {max_model_len} is not a multiple of {BLOCK}")
    if max_num_seqs < MIN_BATCH or not _power_of_two(max_num_seqs):
        out.append(f"batch {max_num_seqs} is not a power of two of at least {MIN_BATCH}")
    if chunk is not None and chunk % BLOCK:
        out.append(f"prefill chunk {chunk} is not a multiple of {BLOCK}")
    return out


def compiled_context(max_model_len: int) -> int:
    """The smallest context a card compiles that holds ``max_model_len`` tokens."""
    return max(MIN_CONTEXT, -(-max_model_len // BLOCK) * BLOCK)


def compiled_batch(max_num_seqs: int) -> int:
    """The smallest batch a card compiles that holds ``max_num_seqs`` requests."""
    return max(MIN_BATCH, 1 << (max_num_seqs - 1).bit_length())


def card_limits(limits: EngineLimits, round_batch: bool = False) -> EngineLimits:
    """``limits`` with the context a card compiles for them (at least 512, whole blocks): a
    test written for a shorter context runs its requests, and sizes its full-length ones, in
    that context. The batch is the test's (a scenario of N requests in flight is N, and a
    batch that is no power of two is refused by ``shape_problems``) unless ``round_batch``:
    a test whose batch size is its own choice, not its subject, takes the card's."""
    batch = compiled_batch(limits.max_num_seqs) if round_batch else limits.max_num_seqs
    return replace(limits, max_model_len=compiled_context(limits.max_model_len),
                   max_num_seqs=batch)
