"""A ``hil selftest`` case: one fault on one target, and the smallest suite selection that must
catch it. The kinds declare their cases with it (``selftest_module``); ``harness.selftest``
runs them."""

from __future__ import annotations

from dataclasses import dataclass

TOKEN = "suites/test_token_equality.py"
FREEING = "suites/test_block_freeing.py"
NO_RECOMPUTE = "suites/test_no_recompute.py"
CAPACITY = "suites/test_capacity.py"
GEOMETRY = "suites/test_geometry.py"
ONE_TOKEN_TEST = "single and not one-token"


@dataclass(frozen=True)
class Case:
    """One fault on one target, and the smallest selection that must catch it."""

    fault: str  # FAULTS name, optionally with :k=v arguments
    target: str
    suite: str
    select: str  # pytest -k
    expect: str  # the failure category that proves the catch
    stack: str = "default"
    extra: tuple[str, ...] = ()

    @property
    def family(self) -> str:
        return self.fault.partition(":")[0]


def vllm_cases(target: str, extra: tuple[str, ...] = ()) -> tuple[Case, ...]:
    """The faults that patch vLLM itself, each with the selection that catches it, on
    ``target``: every kind that runs vLLM catches them the same way, so a kind proves its
    device with them (its DEVICE_CASES)."""
    return (
        Case("perturb-logit:position=5", target, TOKEN, ONE_TOKEN_TEST, "token mismatch",
             extra=extra),
        Case("forget-free", target, FREEING, "finish-back-to-idle", "block leak", extra=extra),
        Case("crash-engine:when=start", target, TOKEN, ONE_TOKEN_TEST,
             "engine crash / harness error", extra=extra),
    )
