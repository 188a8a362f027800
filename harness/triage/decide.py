"""The triage verdict: what the runs say the failure depends on.

The repeats decide first. Failing some but not all of them is nondeterminism. Failing all of
them, the failure reproduces on a fresh engine: a varied condition under which it passes is
one it depends on (alone: batching; the other chunking; the other prefix-caching setting; the
previous stack: a regression). Passing all of them, the failure needs something the fresh run
lacked: a varied condition under which it fails is that something (recycled blocks, a cached
prefix, chunking). Nothing changes the outcome: deterministic, independent of these conditions
(or, never reproduced, dependent on what earlier tests left in the engine).
"""

from __future__ import annotations

from harness.core import triage as r
from harness.core.triage import FAILED, PASSED, TriageRun
from harness.triage.plan import (
    BATCHING,
    CHUNKED,
    FRESH,
    PREFIX,
    PREFIX_OFF,
    PREFIX_ON,
    RECYCLED,
    RECYCLED_ARM,
    REPEAT,
    STACK,
)


def _judged(runs: list[TriageRun], factor: str, arm: str = "") -> list[TriageRun]:
    return [x for x in runs if x.factor == factor and x.arm.startswith(arm)
            and x.outcome in (PASSED, FAILED)]


def _one(runs: list[TriageRun], factor: str, arm: str = "") -> str | None:
    """The outcome of the (first) judged run of ``factor`` whose arm starts with ``arm``."""
    hits = _judged(runs, factor, arm)
    return hits[0].outcome if hits else None


def _prefix_flip(runs: list[TriageRun]) -> tuple[str, str] | None:
    """(the setting that passes, the one that fails) when the prefix pair disagrees, else None."""
    on, off = _one(runs, PREFIX, PREFIX_ON), _one(runs, PREFIX, PREFIX_OFF)
    if {on, off} != {PASSED, FAILED}:
        return None
    return ("on", "off") if on == PASSED else ("off", "on")


def decide(runs: list[TriageRun]) -> tuple[str, str]:
    """(key, verdict sentence) from the runs of one triage."""
    repeats = _judged(runs, REPEAT)
    if not repeats:
        return r.INCONCLUSIVE, "inconclusive: the failed scenario could not be run again"
    failed = sum(x.outcome == FAILED for x in repeats)
    n = len(repeats)
    if 0 < failed < n:
        return r.FLAKY, f"nondeterministic: failed {failed} of {n} (flaky)"
    found: list[tuple[str, str]] = []
    if failed == n:
        alone = _judged(runs, BATCHING)
        if alone and alone[0].outcome == PASSED:
            found.append((r.BATCHING, "depends on batching: fails only when decoded with another"
                          " request"))
        chunk = _judged(runs, CHUNKED)
        if chunk and chunk[0].outcome == PASSED:
            found.append((r.CHUNKED, f"depends on chunked prefill: passes with {chunk[0].arm}"))
        if flip := _prefix_flip(runs):
            found.append((r.PREFIX, f"depends on prefix caching: passes with prefix caching"
                          f" {flip[0]}"))
        previous = _judged(runs, STACK)
        if previous and previous[0].outcome == PASSED:
            found.insert(0, (r.STACK, f"stack regression: passes {previous[0].arm}"))
        if not found:
            also = f"; also fails {previous[0].arm}" if previous else ""
            return r.DETERMINISTIC, (f"deterministic, independent of these conditions (failed"
                                     f" {n} of {n}{also})")
    else:
        fresh, recycled = _one(runs, RECYCLED, FRESH), _one(runs, RECYCLED, RECYCLED_ARM)
        if fresh == PASSED and recycled == FAILED:
            found.append((r.RECYCLED, "depends on recycled blocks: fails only on blocks recycled"
                          " from earlier requests"))
        if flip := _prefix_flip(runs):
            found.append((r.PREFIX, f"depends on prefix caching: fails only with prefix caching"
                          f" {flip[1]} and a prompt served again"))
        chunk = _judged(runs, CHUNKED)
        if chunk and chunk[0].outcome == FAILED:
            found.append((r.CHUNKED, f"depends on chunked prefill: fails only with {chunk[0].arm}"))
        alone = _judged(runs, BATCHING)
        if alone and alone[0].outcome == FAILED:
            found.append((r.BATCHING, "depends on batching: fails only when decoded alone"))
        if not found:
            return r.NOT_REPRODUCED, (
                f"not reproduced: passed {n} of {n} on fresh engines and under every varied"
                " condition; it depends on what earlier tests left in the engine, or is rare")
    key, first = found[0]
    rest = "; ".join(sentence for _, sentence in found[1:])
    return key, first + (f" (also: {rest})" if rest else "")
