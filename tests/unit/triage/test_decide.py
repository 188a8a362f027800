"""The triage verdict from hand-made runs: each verdict the issue names, and the runs that
must not produce it."""

from __future__ import annotations

import pytest

from harness.core import triage as r
from harness.core.triage import ERROR, FAILED, NOT_RUN, PASSED, TriageRun
from harness.triage.decide import decide
from harness.triage.plan import FRESH, PREFIX_OFF, PREFIX_ON, RECYCLED_ARM


def run(factor: str, arm: str, outcome: str) -> TriageRun:
    return TriageRun(factor, arm, "vllm-cpu", ("r0",), outcome, "why")


def runs(repeats=(FAILED,) * 3, alone=FAILED, chunk=FAILED, on=FAILED, off=FAILED,
         fresh=FAILED, recycled=FAILED, stack=None) -> list[TriageRun]:
    out = [run("repeat", f"as run #{i + 1}", o) for i, o in enumerate(repeats)]
    out += [run("batching", "alone (r0)", alone), run("chunked", "chunks of 32 tokens", chunk),
            run("prefix", f"{PREFIX_ON} (second of two runs)", on),
            run("prefix", f"{PREFIX_OFF} (second of two runs)", off),
            run("recycled", FRESH, fresh), run("recycled", RECYCLED_ARM, recycled)]
    if stack is not None:
        out.append(run("stack", "on spyre-1.10", stack))
    return out


@pytest.mark.parametrize("given, key, says", [
    (runs(alone=PASSED), r.BATCHING,
     "depends on batching: fails only when decoded with another request"),
    (runs(repeats=(PASSED,) * 3, fresh=PASSED, on=PASSED, off=PASSED, alone=PASSED, chunk=PASSED),
     r.RECYCLED, "depends on recycled blocks"),
    (runs(chunk=PASSED), r.CHUNKED, "depends on chunked prefill: passes with chunks of 32"),
    (runs(repeats=(PASSED,) * 3, on=FAILED, off=PASSED, fresh=PASSED, recycled=PASSED,
          alone=PASSED, chunk=PASSED), r.PREFIX, "depends on prefix caching: fails only with"
     " prefix caching on"),
    (runs(repeats=(FAILED, PASSED, PASSED)), r.FLAKY, "nondeterministic: failed 1 of 3 (flaky)"),
    (runs(repeats=(FAILED, FAILED, PASSED)), r.FLAKY, "failed 2 of 3"),
    (runs(stack=PASSED), r.STACK, "stack regression: passes on spyre-1.10"),
    (runs(stack=FAILED), r.DETERMINISTIC,
     "deterministic, independent of these conditions (failed 3 of 3; also fails on spyre-1.10)"),
    (runs(repeats=(PASSED,) * 3, fresh=PASSED, recycled=PASSED, on=PASSED, off=PASSED,
          alone=PASSED, chunk=PASSED), r.NOT_REPRODUCED, "not reproduced: passed 3 of 3"),
])
def test_each_verdict_from_its_runs(given, key, says) -> None:
    got_key, verdict = decide(given)
    assert got_key == key
    assert says in verdict


def test_prefix_caching_says_which_setting_passes() -> None:
    key, verdict = decide(runs(on=FAILED, off=PASSED))
    assert key == r.PREFIX and "passes with prefix caching off" in verdict
    key, verdict = decide(runs(on=PASSED, off=FAILED))
    assert key == r.PREFIX and "passes with prefix caching on" in verdict
    # both pass (the repeats fail): the second run of each is what differs, not the setting
    assert decide(runs(on=PASSED, off=PASSED))[0] == r.DETERMINISTIC


def test_several_conditions_are_all_named_the_first_is_the_key() -> None:
    key, verdict = decide(runs(alone=PASSED, chunk=PASSED))
    assert key == r.BATCHING
    assert "(also: depends on chunked prefill" in verdict


def test_errors_and_not_run_arms_decide_nothing() -> None:
    given = runs(alone=ERROR, chunk=NOT_RUN, stack=ERROR)
    assert decide(given)[0] == r.DETERMINISTIC
    assert decide([run("repeat", "as run #1", ERROR)])[0] == r.INCONCLUSIVE


def test_recycled_needs_the_fresh_arm_to_pass() -> None:
    given = runs(repeats=(PASSED,) * 3, fresh=FAILED, recycled=FAILED, alone=PASSED,
                 chunk=PASSED, on=PASSED, off=PASSED)
    assert decide(given)[0] == r.NOT_REPRODUCED
