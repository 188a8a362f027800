"""What each stack of a run lacks, as the report says it once per stack: a section of the run
summary and a property of the report's environment (``stack.<name>.lacks``).

The run collects only what its stack has (harness.plugin.stack_variants), so these, not skipped
tests, are where a stack's missing variants and suites show (harness.session.stack_lacks).
"""

from __future__ import annotations

from collections.abc import Iterable

from harness.report.markdown import md_cell
from harness.session.stack_lacks import stack_lacks

HEADING = "## What each stack does not have (not collected)"


def lacks_markdown(stacks: Iterable[str]) -> str:
    """The summary's section: per stack, the variants and suites it does not have and why
    (from its stack file and the kinds' plugin generations); empty when none lacks anything."""
    rows = []
    for stack in dict.fromkeys(stacks):
        for subjects, reason in stack_lacks(stack).reasons():
            rows.append(f"| {md_cell(stack)} | {md_cell(', '.join(subjects))} | {md_cell(reason)} |")
    if not rows:
        return ""
    return "\n".join([HEADING, "", "| stack | not collected | why |", "|---|---|---|", *rows, ""])


def lacks_property(stack: str) -> dict[str, str]:
    """``stack.<name>.lacks``: what the stack does not have, by reason (``a, b: why; c: why``);
    none for a stack that lacks nothing."""
    lines = stack_lacks(stack).lines()
    return {f"stack.{stack}.lacks": "; ".join(lines)} if lines else {}
