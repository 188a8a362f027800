"""Aborted requests: a request whose client went away (``RequestSpec.abort_step``) was really
aborted, and the engine stopped serving it.

The harness aborts a request just before its abort step through the engine's own client call
(``harness.in_engine.process``). That it gives its blocks back at that step is the ledger's
business (``block_timing``: an aborted request is finished by the scheduler at that step;
``promises``: no promise outlives its request; ``idle_all_free``); this check makes sure the
abort was exercised at all (a request that finished before its abort step, or had not
arrived, tests nothing) and that the engine did not go on to deliver its output.
"""

from __future__ import annotations

from collections.abc import Mapping

from harness.core import verdict as checks
from harness.core.trace import Trace
from harness.core.verdict import Verdict

NAME = "kv_ledger.aborts"


def check_aborts(aborts: Mapping[str, int], trace: Trace) -> Verdict:
    """``aborts``: request id -> the step before which the scenario aborts it."""
    if not aborts:
        return Verdict.passed(NAME, "the scenario aborts no request")
    done = {r: s.step for s in trace.steps for r in s.aborted}
    missed = {r: at for r, at in aborts.items() if done.get(r) != at}
    if missed:
        where = "; ".join(
            f"request {r} before step {at}: " + (
                f"aborted at step {done[r]} instead" if r in done else
                "it was not live then (finished earlier, or had not arrived)")
            for r, at in sorted(missed.items()))
        return Verdict.failed(
            checks.KV_LEDGER_UNRECORDED,
            f"the scenario's aborts were not exercised, so the run tests no abort: {where}")
    served = sorted(r for r in aborts if r in trace.requests)
    if served:
        return Verdict.failed(
            NAME, f"the engine delivered the output of request(s) {served} after they were"
                  f" aborted (at steps {[aborts[r] for r in served]}): it went on serving them")
    return Verdict.passed(
        NAME, f"{len(aborts)} request(s) aborted at their step and not served after")
