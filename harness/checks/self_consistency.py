"""Greedy self-consistency: under greedy sampling the device's token is its own top-1.

Independent of the reference: at every generated position of a greedy free run, the
logprob of the token the device chose must be the largest of the device's own recorded
top-k logprobs at that position. A sampler (or argmax) that does not take the maximum
shows here even where token equality accepts its choice as a near-tie, because the
reference hesitates between the same two tokens.

Rule. With ``c`` the chosen token's logprob (read from the step's ``top_logprobs``,
else ``TokenStep.logprob``) and ``t`` the largest recorded logprob at the position, the
position fails iff ``t - c > max(ABS_TOL, REL_TOL * max(|t|, |c|))``. vLLM computes the
returned logprobs as ``log_softmax`` of the same float32 logits the argmax reads, so a
correct argmax gives ``c == t`` exactly: ``log_softmax`` subtracts one value from every
logit and rounding is monotonic, so a tie stays a tie and the maximum stays the maximum.
The tolerance (1e-6 absolute or relative, about 8 float32 ulps at a logprob of -1) only
absorbs rounding where a target computes its logprobs on another path than its argmax;
any real choice of a runner-up costs far more than that.

What cannot be checked is said, never passed silently: a position without recorded
logprobs (an empty ``top_logprobs``, or NaN values) is counted as unchecked, and a trace
where no position could be checked fails with ``SELF_CONSISTENCY_UNRECORDED`` (a harness
problem: the engine was asked for top-k logprobs). A trace of a sampled (non-greedy) run
passes saying the check does not apply. Positions are 0-based generated positions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.checks.logprobs import own_logprob
from harness.core.trace import TokenStep, Trace
from harness.core.verdict import SELF_CONSISTENCY, SELF_CONSISTENCY_UNRECORDED, Verdict

ABS_TOL = 1e-6
REL_TOL = 1e-6
_SHOWN = 8  # positions listed per request in a failure


@dataclass(frozen=True)
class Inconsistency:
    """One position whose chosen token is not the device's own top-1."""

    request_id: str
    position: int
    chosen: int
    chosen_logprob: float
    top1: int
    top1_logprob: float

    @property
    def gap(self) -> float:
        return self.top1_logprob - self.chosen_logprob

    def sentence(self) -> str:
        return (f"request {self.request_id} position {self.position} chose token {self.chosen}"
                f" (logprob {self.chosen_logprob:.4f}) but the device's own top-1 is token"
                f" {self.top1} (logprob {self.top1_logprob:.4f})")


def within_rounding(top1_logprob: float, chosen_logprob: float) -> bool:
    """Whether the chosen token's logprob equals the top-1's up to float rounding."""
    if top1_logprob == chosen_logprob:  # also both -inf
        return True
    scale = max(abs(top1_logprob), abs(chosen_logprob))
    return top1_logprob - chosen_logprob <= max(ABS_TOL, REL_TOL * scale)


def top1(step: TokenStep) -> tuple[int, float] | None:
    """The step's own top-1 token and logprob (ties: the lowest id); None when unrecorded."""
    if not step.top_logprobs:
        return None
    return min(step.top_logprobs.items(), key=lambda kv: (-kv[1], kv[0]))


def checkable(step: TokenStep) -> bool:
    """Whether the step recorded logprobs to judge its token by (non-empty, none NaN)."""
    chosen = own_logprob(step)
    return (bool(step.top_logprobs) and not math.isnan(chosen)
            and not any(math.isnan(v) for v in step.top_logprobs.values()))


def inconsistency(request_id: str, position: int, step: TokenStep) -> Inconsistency | None:
    """The position's inconsistency; None when its token is its top-1 (or it is not checkable)."""
    best = top1(step)
    chosen = own_logprob(step)
    if best is None or not checkable(step) or within_rounding(best[1], chosen):
        return None
    return Inconsistency(request_id, position, step.token_id, chosen, best[0], best[1])


def _plural(n: int, word: str) -> str:
    return f"{n} {word if n == 1 else word + 's'}"


def check_self_consistency(trace: Trace, greedy: bool = True) -> Verdict:
    """Every generated position of ``trace``'s free run chose the device's own top-1."""
    if not greedy:
        return Verdict.passed(SELF_CONSISTENCY, f"not applicable on {trace.target}: the run"
                              " was sampled, not greedy")
    found: dict[str, list[Inconsistency]] = {}
    checked = unchecked = 0
    for rid, req in trace.requests.items():
        for pos, step in enumerate(req.steps):
            if not checkable(step):
                unchecked += 1
                continue
            checked += 1
            bad = inconsistency(rid, pos, step)
            if bad is not None:
                found.setdefault(rid, []).append(bad)
    skipped = "" if not unchecked else (
        f"; {_plural(unchecked, 'position')} without recorded logprobs not checked")
    head = (f"greedy self-consistency on {trace.target}: {_plural(checked, 'position')} of"
            f" {_plural(len(trace.requests), 'request')} checked{skipped}")
    if not checked:
        why = (f"greedy self-consistency could not be checked on {trace.target}: no position"
               f" of {_plural(len(trace.requests), 'request')} has recorded top-k logprobs"
               f" ({_plural(unchecked, 'position')} without)")
        return Verdict.failed(SELF_CONSISTENCY_UNRECORDED, why, details=(
            why + "\nWhat to do: the engine was asked for top-k logprobs; find why its"
            " output carries none (the check needs them to know the device's top-1)."))
    if not found:
        return Verdict.passed(SELF_CONSISTENCY, head + ": every chosen token is the top-1")
    first = next(iter(found.values()))[0]
    n = sum(len(v) for v in found.values())
    why = (f"greedy self-consistency: {first.sentence()}: the sampler did not take the maximum"
           f" ({_plural(n, 'position')} in {_plural(len(found), 'request')} on {trace.target})")
    lines = [why, head, f"tolerance: {ABS_TOL:g} nats absolute or {REL_TOL:g} relative", ""]
    for rid, bad in found.items():
        lines.append(f"request {rid}: {_plural(len(bad), 'position')} not the top-1")
        for b in bad[:_SHOWN]:
            lines.append(f"  position {b.position}: chose {b.chosen} ({b.chosen_logprob:.6f}),"
                         f" top-1 {b.top1} ({b.top1_logprob:.6f}), gap {b.gap:.3g} nats")
        if len(bad) > _SHOWN:
            lines.append(f"  ... {len(bad) - _SHOWN} more")
    lines.append("What to do: the device's own logprobs say its token is not its maximum, so its"
                 " sampler or argmax is wrong (whatever the reference says); read its greedy"
                 " path, not its numerics.")
    return Verdict.failed(SELF_CONSISTENCY, why, at=first.position, details="\n".join(lines))
