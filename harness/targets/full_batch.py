"""Full-batch scenarios: ``max_num_seqs`` requests that together fill a full-batch KV pool.

Each request is as long as its target lets one request be (``full_length_max_tokens`` of
the target's kind), so on a pool sized for exactly a full batch one block too many for any
request shows as a preemption, and one block too few as a pool that never runs out.
"""

from __future__ import annotations

from harness.scenario.prompts import EngineLimits, Scenario, Tokenizer, shaped_scenario
from harness.targets import kind


def full_batch_scenario(tokenizer: Tokenizer, target: str, limits: EngineLimits,
                        prompt_len: int) -> Scenario:
    """``limits.max_num_seqs`` requests of ``prompt_len`` tokens arriving together, each
    generating as many tokens as ``target`` lets one request of that prompt hold."""
    max_tokens = kind(target).full_length_max_tokens(limits.max_model_len, prompt_len)
    shapes = [(prompt_len, max_tokens, 0)] * limits.max_num_seqs
    return shaped_scenario(f"full-batch-{limits.max_num_seqs}x{prompt_len}", tokenizer, shapes,
                           limits)
