"""Which stacks pad a lone decoding request with a dummy request (``SpyreTarget.pads_decode_batch``).

vllm-spyre 0.3-0.4 runs decode batches of at least two: a request decoding alone is
padded with a dummy that holds KV blocks. Whether a stack does this is declared here,
not read from the run, so a ledger adapter that stops seeing the dummy fails the
dummy-padding test instead of turning it into a skip (the verdict:
``harness.checks.dummy_padding``). The declaration lives in the harness, not in
stacks/*.toml, because a stack's toml is part of its install stamp.
"""

from __future__ import annotations

# stack name -> the target variants whose runner pads a lone decoding request with a dummy
PADS_DECODE_BATCH: dict[str, tuple[str, ...]] = {
    "legacy-spyre-0.4": ("spyre-eager-cb", "spyre-sendnn-cb"),
}

# Where the declaration lives, as the dummy-padding verdict names it.
DECLARED_IN = __name__.replace(".", "/") + ".py"


def pads_decode_batch(stack: str, variant: str) -> bool:
    """True when ``stack`` declares that ``variant`` pads a lone decoding request."""
    return variant in PADS_DECODE_BATCH.get(stack, ())
