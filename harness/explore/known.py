"""Failures of the stacks themselves that are already known: the explorer meets them, counts
them and goes on, as the suites report a quarantined test as known (quarantine.toml).

Quarantine names suite tests; an example has no test id, so a known failure is told by its
verdict: the check that failed, the stack and target variants it is known on, and what of the
example it depends on. Each entry names the upstream note that describes it; lift it when the
stack is fixed (a stack whose failure is gone never meets the entry).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from harness.core.verdict import Verdict
from harness.explore.example import Example

# The check an engine's crash, hang or failed call during a run is filed as (by the runner).
ENGINE_ERROR = "engine_error"

_REQUEST = re.compile(r"\brequest (r\d+)\b")
# What the engine process says when a run's requests are still there at its step limit.
STARVED = "scenario did not finish within"


def _aborted(example: Example) -> set[str]:
    return {f"r{i}" for i, r in enumerate(example.requests) if r.abort_after is not None}


def names_an_aborted_request(verdict: Verdict, example: Example) -> bool:
    """The verdict's first line names a request the example aborts."""
    named = _REQUEST.findall(verdict.why)
    return bool(named) and named[0] in _aborted(example)


def starved_after_an_abort(verdict: Verdict, example: Example) -> bool:
    """The run never finished (a request waited for blocks to the step limit) in an example
    that aborts a request: the blocks its kept promise holds never come back."""
    return bool(_aborted(example)) and STARVED in verdict.why


_POOL_VS_DEVICE = re.compile(r"the pool has (\d+) blocks but the device's KV cache holds (\d+)")


def override_rounded_down(verdict: Verdict, example: Example) -> bool:
    """The device's KV cache is the pool rounded down to a multiple of max_num_seqs, and the
    pool is not one: what sendnn-inference 2.6.3 allocates for such an override."""
    found = _POOL_VS_DEVICE.search(verdict.why)
    if not found:
        return False
    pool, device = int(found.group(1)), int(found.group(2))
    batch = example.geometry.max_num_seqs
    return pool % batch != 0 and device == pool - pool % batch


_OUT_OF_BOUNDS = re.compile(r"IndexError: index (\d+) is out of bounds for dimension 0 with"
                            r" size (\d+)")


def block_past_the_rounded_cache(verdict: Verdict, example: Example) -> bool:
    """The same defect once the scheduler hands out a block past the rounded-down cache: the
    runner indexes its KV cache (a multiple of max_num_seqs blocks) less than a batch past
    its end, and the engine's call fails."""
    found = _OUT_OF_BOUNDS.search(verdict.why)
    if not found:
        return False
    index, size = int(found.group(1)), int(found.group(2))
    batch = example.geometry.max_num_seqs
    return size % batch == 0 and size <= index < size + batch


@dataclass(frozen=True)
class KnownFailure:
    """A failure of a stack that is known: ``check`` failing on ``stacks`` for target variants
    whose id starts with one of ``targets``, where ``applies(verdict, example)``."""

    summary: str
    issue: str
    check: str
    stacks: tuple[str, ...]
    targets: tuple[str, ...]
    applies: Callable[[Verdict, Example], bool]

    def matches(self, verdict: Verdict, example: Example, variant: str, stack: str) -> bool:
        return (not verdict.ok and verdict.check == self.check and stack in self.stacks
                and variant.startswith(self.targets) and self.applies(verdict, example))


KNOWN: tuple[KnownFailure, ...] = (
    # quarantine.toml's first entry, met by any workload that aborts a request holding a promise.
    KnownFailure(
        summary="sendnn-inference 2.6.3 keeps an aborted request's block promise",
        issue="docs/upstream/sendnn-inference-abort-keeps-promise.md",
        check="kv_ledger.promises",
        stacks=("default",),
        targets=("spyre-",),
        applies=names_an_aborted_request,
    ),
    # The same leak seen from the queue: where the pool holds no more than the requests' own
    # blocks, the kept promise leaves a later request waiting for ever (the run stops at the
    # engine's step limit, so no ledger is judged).
    KnownFailure(
        summary="sendnn-inference 2.6.3 keeps an aborted request's block promise (a later"
                " request waits for ever)",
        issue="docs/upstream/sendnn-inference-abort-keeps-promise.md",
        check=ENGINE_ERROR,
        stacks=("default",),
        targets=("spyre-",),
        applies=starved_after_an_abort,
    ),
    # A block count the device rounds down for its batch while the scheduler keeps the
    # override: every geometry whose pool is not a multiple of max_num_seqs meets it at start.
    KnownFailure(
        summary="sendnn-inference 2.6.3 allocates an override not a multiple of max_num_seqs"
                " rounded down, while its scheduler hands out the override's blocks",
        issue="docs/upstream/sendnn-inference-override-not-a-multiple-of-the-batch.md",
        check="kv_ledger.device_blocks",
        stacks=("default",),
        targets=("spyre-",),
        applies=override_rounded_down,
    ),
    KnownFailure(
        summary="sendnn-inference 2.6.3 allocates an override not a multiple of max_num_seqs"
                " rounded down: its runner indexes a block past its KV cache",
        issue="docs/upstream/sendnn-inference-override-not-a-multiple-of-the-batch.md",
        check=ENGINE_ERROR,
        stacks=("default",),
        targets=("spyre-",),
        applies=block_past_the_rounded_cache,
    ),
)


def known_failure(verdict: Verdict, example: Example, variant: str, stack: str,
                  known: tuple[KnownFailure, ...] = KNOWN) -> KnownFailure | None:
    """The known failure ``verdict`` is, or None."""
    return next((k for k in known if k.matches(verdict, example, variant, stack)), None)
