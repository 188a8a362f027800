"""Which stacks pad a lone decoding request with a dummy request, and the verdict on it.

vllm-spyre 0.3-0.4 runs decode batches of at least two: a request decoding alone is
padded with a dummy that holds KV blocks. Whether a stack does this is declared here,
not read from the run, so a ledger adapter that stops seeing the dummy fails the
dummy-padding test instead of turning it into a skip. The declaration lives in the
harness, not in stacks/*.toml, because a stack's toml is part of its install stamp.
"""

from __future__ import annotations

from harness.checks.dummy_padding import check_dummy_padding, dummy_blocks_per_step
from harness.core.trace import Trace
from harness.core.verdict import DUMMY_PADDING, Verdict

# stack name -> the target variants whose runner pads a lone decoding request with a dummy
PADS_DECODE_BATCH: dict[str, tuple[str, ...]] = {
    "legacy-spyre-0.4": ("spyre-eager-cb", "spyre-sendnn-cb"),
}


def pads_decode_batch(stack: str, variant: str) -> bool:
    """True when ``stack`` declares that ``variant`` pads a lone decoding request."""
    return variant in PADS_DECODE_BATCH.get(stack, ())


def dummy_padding_verdict(trace: Trace, stack: str, variant: str) -> Verdict | None:
    """The dummy-padding verdict of a run where one request decodes alone before a second
    joins; None where the stack declares no padding and none was seen (nothing to check).

    A declared stack whose ledgers show no dummy fails, and so does an undeclared one
    whose ledgers show a dummy: the declaration and the data must agree."""
    seen = any(dummy_blocks_per_step(trace).values())
    declared = pads_decode_batch(stack, variant)
    if declared and not seen:
        return Verdict.failed(
            DUMMY_PADDING,
            f"stack {stack} declares that {variant} pads a lone decoding request with a dummy"
            " (harness/targets/spyre/padding.py), but no dummy held a block at any step: the runner"
            " stopped padding, or the ledger adapter (harness/in_engine/probes.py) no longer"
            " sees its dummy",
        )
    if seen and not declared:
        return Verdict.failed(
            DUMMY_PADDING,
            f"a dummy request held KV blocks on {variant}, but stack {stack} does not declare"
            " dummy padding: declare it in harness/targets/spyre/padding.py if the stack pads decode"
            " batches",
        )
    if not declared:
        return None
    return check_dummy_padding(trace)
