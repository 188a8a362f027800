"""Dummy padding: where a stack pads a lone decoding request with a dummy request, the dummy's
blocks are taken while the request decodes alone and returned by the step a second one joins."""

from __future__ import annotations

from harness.core.trace import Trace
from harness.core.verdict import DUMMY_PADDING, Verdict
from harness.render.ledger_table import format_step_table


def dummy_blocks_per_step(trace: Trace) -> dict[int, list[int]]:
    """Engine step -> blocks held by dummy requests in its ledgers."""
    return {r.step: sorted(b for s in r.kv for b in s.dummy_blocks()) for r in trace.steps}

def check_dummy_padding(trace: Trace) -> Verdict:
    """Where a lone decoding request is padded with a dummy (vllm-spyre 0.3-0.4): the dummy
    holds blocks while the first request decodes alone, none at the step where a second
    request joins, and none at the end. Passes with ``why`` "no dummy" where the stack pads
    no batch (callers decide whether that is a skip)."""
    held = dummy_blocks_per_step(trace)
    if not any(held.values()):
        return Verdict.passed(DUMMY_PADDING, "no dummy")
    joined = next((r.step for r in trace.steps if len(r.running) >= 2), None)
    if joined is None:
        return Verdict.failed(DUMMY_PADDING, "no step ran two requests at once; nothing joined")

    def fail(why: str, at: int) -> Verdict:
        table = format_step_table(trace.ledger_steps(), at)
        return Verdict.failed(DUMMY_PADDING, why, at=at, details=f"{why}\n{table}")

    if not any(blocks for st, blocks in held.items() if st < joined):
        return fail(f"no dummy blocks while the first request decoded alone before step"
                    f" {joined}: {held}", joined)
    if held[joined]:
        return fail(f"dummy still holds {held[joined]} at step {joined}, where a second"
                    " request joined", joined)
    last = trace.steps[-1].step
    if held[last]:
        return fail(f"dummy blocks {held[last]} held at idle (step {last})", last)
    return Verdict.passed(DUMMY_PADDING, f"dummy taken while alone, returned at step {joined}")


def dummy_padding_verdict(trace: Trace, declared: bool, stack: str, variant: str,
                          declared_in: str) -> Verdict | None:
    """The dummy-padding verdict of a run where one request decodes alone before a second
    joins, given whether the target's kind declares (in ``declared_in``) that ``variant`` pads
    on ``stack``; None where it declares no padding and none was seen (nothing to check).

    A declared stack whose ledgers show no dummy fails, and so does an undeclared one
    whose ledgers show a dummy: the declaration and the data must agree."""
    seen = any(dummy_blocks_per_step(trace).values())
    if declared and not seen:
        return Verdict.failed(
            DUMMY_PADDING,
            f"stack {stack} declares that {variant} pads a lone decoding request with a dummy"
            f" ({declared_in}), but no dummy held a block at any step: the runner"
            " stopped padding, or the ledger adapter (harness/in_engine/probes.py) no longer"
            " sees its dummy",
        )
    if seen and not declared:
        return Verdict.failed(
            DUMMY_PADDING,
            f"a dummy request held KV blocks on {variant}, but stack {stack} does not declare"
            f" dummy padding: declare it in {declared_in} if the stack pads decode"
            " batches",
        )
    if not declared:
        return None
    return check_dummy_padding(trace)
