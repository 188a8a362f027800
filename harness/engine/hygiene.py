"""Engine hygiene: a reused engine is idle and clean before the next test uses it.

Engines are shared by the tests of one configuration (start-up is most of a run's cost).
State an engine carries from one test to the next (a leaked block, a request that never
finished) would fail every later test for a bug it did not cause, at the wrong step. So
before a test first uses an engine that an earlier test used, its KV ledgers are checked
with the idle invariants (``harness.checks.ledger``: every per-step invariant and "all
free"), on every ledger the engine has (vLLM's block pool and, on vllm-spyre, the runner's):

* the state the earlier test left is known when its last call read the ledgers (a
  step-driven run's last step, or a snapshot): no engine call; otherwise (``generate``, a
  call that failed) one ``kv_snapshot`` call reads it;
* clean: the test uses the engine as it is;
* dirty: the engine is replaced by a fresh one for this test, and the replacement is
  recorded (``Dirty``: which test left it dirty, and how);
* dirty and not replaceable (``--no-engine-replace``, e.g. a card that cannot be
  restarted within the run): the test inherits it; its ledger verdicts are judged against
  the inherited state (``judge_trace``, ``judge_snapshots``): what its own run broke fails
  at its own step, and a run that broke nothing fails as ``inherited_state`` naming the
  test that left the engine so.

What a fresh engine of a configuration shows right after start-up (e.g. a warmup leak) is
that configuration's own state, not something a test left: it is learnt from the first
step-driven run's initial record, or from the probe after a replacement, and only
problems beyond it count as dirt (so such a configuration is not restarted again and again).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from harness.checks.ledger import Violation, check_idle, check_step, ledger_violations
from harness.core.errors import EngineError, EngineRequestError
from harness.core.trace import KvSnapshot, Trace
from harness.core.verdict import INHERITED_STATE, KV_LEDGER, Verdict
from harness.render.ledger_table import format_step_table

if TYPE_CHECKING:
    from harness.core.config import EngineConfig
    from harness.engine.host import EngineHost
    from harness.engine.pool import EnginePool

NO_REPLACE_REASON = "--no-engine-replace"
MAX_LISTED = 5


def problem_line(v: Violation) -> str:
    """One violation as a step-free line; equal lines mean the same state."""
    src = f" {v.source}" if v.source else ""
    return f"[{v.invariant}]{src}: {v.message}"


# Invariants whose message is a count seen vs a count expected: a leaked block shifts both
# counts as the pool fills and drains, so the same inherited fault is the same offset.
_COUNT_INVARIANTS = ("reported_free", "free_counter")
_LINE = re.compile(r"^\[(\w+)\]([^:]*): (.*)$")
_NUMBER = re.compile(r"-?\d+")


def problem_key(line: str) -> str:
    """What makes two problem lines the same state: the line itself, except that a count
    invariant is known by its offset (seen - expected), not by the counts."""
    m = _LINE.match(line)
    if m is None or m.group(1) not in _COUNT_INVARIANTS:
        return line
    numbers = [int(n) for n in _NUMBER.findall(m.group(3))[:2]]
    if len(numbers) < 2:
        return line
    return f"[{m.group(1)}]{m.group(2)}: off by {numbers[0] - numbers[1]:+d}"


def _keys(lines: Iterable[str]) -> set[str]:
    return {problem_key(p) for p in lines}


def idle_problems(snapshots: list[KvSnapshot]) -> tuple[str, ...]:
    """What breaks the idle invariants (every per-step invariant, and all free) in
    ``snapshots`` taken at an idle point; () when clean."""
    lines: list[str] = []
    for s in snapshots:
        lines += [problem_line(v) for v in check_step(s, None) + check_idle(s, None)]
    return tuple(dict.fromkeys(lines))


def trace_end_problems(trace: Trace) -> tuple[str, ...] | None:
    """The state a step-driven run left the engine in (None: unknown, e.g. no snapshots)."""
    last = trace.steps[-1] if trace.steps else trace.initial
    if last is None or not last.kv or (trace.steps and not trace.idle_at_end):
        return None
    return idle_problems(last.kv)


def _listed(lines: tuple[str, ...]) -> str:
    more = f" (+{len(lines) - MAX_LISTED} more)" if len(lines) > MAX_LISTED else ""
    return "; ".join(lines[:MAX_LISTED]) + more


@dataclass(frozen=True)
class Dirty:
    """A reused engine found dirty before a test: which, left by whom, how, and what was done."""

    config: str  # the configuration's label
    key: str
    left_by: str  # the test that first left it so ("" for start-up)
    problems: tuple[str, ...]
    test: str  # the test about to use it
    replaced: bool
    note: str = ""  # e.g. why it was not replaced

    def describe(self) -> str:
        who = self.left_by or "start-up"
        done = "replaced by a fresh engine" if self.replaced else f"not replaced ({self.note})"
        extra = f"; {self.note}" if self.replaced and self.note else ""
        return (f"engine {self.config} left dirty by {who}: {_listed(self.problems)};"
                f" {done} for {self.test}{extra}")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["problems"] = list(self.problems)
        return d


@dataclass
class _EngineState:
    host: Any  # the EngineHost this describes
    test: str  # the last test that used it
    problems: tuple[str, ...] | None = None  # what it was left with (None: unknown)
    culprit: str = ""  # the test that first left it dirty (kept while inherited)
    inherited: frozenset[str] = frozenset()  # problem keys the last test was handed
    used: bool = False  # any call made on it yet


@dataclass
class HygieneStats:
    restarts: int = 0  # dirty engines replaced
    probes: int = 0  # kv_snapshot calls made only to learn an engine's state
    checks: int = 0  # handovers of an engine from one test to another
    unreadable: list[str] = field(default_factory=list)  # probes the engine refused
    events: list[dict[str, Any]] = field(default_factory=list)


class EngineHygiene:
    """Checks each engine handed from one test to another; replaces or flags a dirty one."""

    def __init__(
        self,
        probe: Callable[[EngineHost], list[KvSnapshot]],
        current_test: Callable[[], str],
        replace: bool = True,
    ) -> None:
        self.probe = probe
        self.current_test = current_test
        self.replace = replace
        self._states: dict[str, _EngineState] = {}
        self._start_problems: dict[str, tuple[str, ...]] = {}  # config key -> a fresh engine's
        self.events: list[Dirty] = []
        self.stats = HygieneStats()

    # -- before a call --------------------------------------------------------
    def engine_for(self, cfg: EngineConfig, pool: EnginePool) -> EngineHost:
        """The live engine of ``cfg`` from ``pool`` for the running test, clean or replaced
        (or flagged as inherited)."""
        host = pool.get(cfg)
        test = self.current_test()
        st = self._states.get(cfg.key)
        if st is None or st.host is not host:  # a fresh engine: its state is its own
            self._states[cfg.key] = _EngineState(host, test)
            return host
        if st.test == test:
            return host
        self.stats.checks += 1
        problems = st.problems if st.problems is not None else self._probe(host)
        start = _keys(self._start_problems.get(cfg.key, ()))
        new = tuple(p for p in problems if problem_key(p) not in start)
        # The first culprit, unless the last test added dirt of its own to what it inherited.
        left_by = st.culprit if st.culprit and _keys(new) <= st.inherited else st.test
        if not new:
            st.test, st.problems = test, problems
            return host
        if not self.replace:
            st.test, st.problems, st.culprit = test, problems, left_by
            st.inherited = frozenset(_keys(new))
            return self._record(Dirty(cfg.label, cfg.key, left_by, new, test, False,
                                      NO_REPLACE_REASON), host)
        fresh = pool.replace(cfg)
        self.stats.restarts += 1
        fresh_start = self._probe(fresh)
        self._start_problems[cfg.key] = fresh_start
        self._states[cfg.key] = _EngineState(fresh, test, problems=fresh_start)
        note = ""
        if _keys(new) <= _keys(fresh_start):
            note = ("a fresh engine of this configuration starts so too: the state is its"
                    " start-up's, not replaced again")
            left_by = ""
        return self._record(Dirty(cfg.label, cfg.key, left_by, new, test, True, note), fresh)

    def _record(self, event: Dirty, host: EngineHost) -> EngineHost:
        self.events.append(event)
        self.stats.events.append(event.to_dict())
        return host

    def _probe(self, host: EngineHost) -> tuple[str, ...]:
        self.stats.probes += 1
        try:
            return idle_problems(self.probe(host))
        except EngineRequestError as e:
            # Alive but without a ledger to read: nothing to judge by, and restarting an engine
            # for that (a Neuron compile) would cost more than it could find.
            self.stats.unreadable.append(str(e).splitlines()[0] if str(e) else repr(e))
            return ()
        except EngineError as e:  # dead or hung: it cannot say its state, it is not clean
            first = str(e).splitlines()[0] if str(e) else repr(e)
            return (f"[probe] the engine did not answer the idle check: {first}",)

    # -- after a call ---------------------------------------------------------
    def _state(self, cfg: EngineConfig) -> _EngineState | None:
        return self._states.get(cfg.key)

    def calling(self, cfg: EngineConfig) -> None:
        """A call begins: until it answers, the engine's state is unknown."""
        st = self._state(cfg)
        if st is not None:
            st.problems = None

    def after_trace(self, cfg: EngineConfig, trace: Trace) -> None:
        """A scenario ran: a step-driven run's last step says what it left (else unknown);
        the first run on a fresh engine also shows the configuration's start-up state."""
        st = self._state(cfg)
        if st is None:
            return
        if not st.used and trace.initial is not None and trace.initial.kv:
            self._start_problems.setdefault(cfg.key, idle_problems(trace.initial.kv))
        st.used = True
        st.problems = trace_end_problems(trace)

    def after_snapshots(self, cfg: EngineConfig, snapshots: list[KvSnapshot]) -> None:
        """The ledgers were read at an idle point: that is the state the next test gets."""
        st = self._state(cfg)
        if st is None:
            return
        problems = idle_problems(snapshots) if snapshots else None
        if not st.used and problems is not None:
            self._start_problems.setdefault(cfg.key, problems)
        st.used = True
        st.problems = problems

    # -- what a test inherited -----------------------------------------------
    def affecting(self, test: str) -> list[Dirty]:
        """The dirty engines found before ``test`` (replaced, or inherited by it)."""
        return [e for e in self.events if e.test == test]

    def inherited(self, test: str, config_label: str) -> Dirty | None:
        """The dirty state ``test`` runs on with the engine ``config_label`` (not replaced)."""
        return next((e for e in self.events
                     if e.test == test and e.config == config_label and not e.replaced), None)


# ------------------------------------------------------------------ verdicts on inherited state


def inherited_verdict(event: Dirty) -> Verdict:
    """The test's own run broke nothing, but it ran on an engine another test left dirty."""
    why = (f"engine {event.config} was left dirty by {event.left_by or 'start-up'} and not"
           f" replaced ({event.note}): {_listed(event.problems)}; this test's own run broke no"
           " ledger invariant")
    details = "\n".join([why, "inherited state (before this test's first step):",
                         *(f"  {p}" for p in event.problems)])
    return Verdict.failed(INHERITED_STATE, why, at=-1, details=details)


def judge_trace(trace: Trace, event: Dirty, verdict: Verdict) -> Verdict:
    """``verdict`` (the ledger verdict of ``trace``) with the inherited state taken out:
    violations equal to one of ``event.problems`` are the earlier test's."""
    if verdict.ok or not verdict.check.startswith(KV_LEDGER + ".") or verdict.check.endswith(
            ".unrecorded"):
        return verdict
    inherited = _keys(event.problems)
    own = [v for v in ledger_violations(trace) if problem_key(problem_line(v)) not in inherited]
    if not own:
        return inherited_verdict(event)
    first = own[0]
    at = first.step if first.step is not None else -1
    why = f"kv invariant {first.invariant} broken at step {first.step}: {first.message}"
    lines = [why, format_step_table(trace.ledger_steps(), at),
             f"{len(own)} violation(s) of this test's own run:"]
    lines += [f"  step {v.step}: [{v.invariant}] {v.message}" for v in own[:20]]
    lines += [f"not counted, inherited from {event.left_by or 'start-up'}:",
              *(f"  {p}" for p in event.problems)]
    return Verdict.failed(f"{KV_LEDGER}.{first.invariant}", why, at=at, details="\n".join(lines))


def judge_snapshots(snapshots: list[KvSnapshot], event: Dirty, verdict: Verdict) -> Verdict:
    """``verdict`` (an idle check of ``snapshots``) with the inherited state taken out."""
    if verdict.ok or not verdict.check.startswith(KV_LEDGER + ".") or verdict.check.endswith(
            ".unrecorded"):
        return verdict
    inherited = _keys(event.problems)
    own = [p for p in idle_problems(snapshots) if problem_key(p) not in inherited]
    if not own:
        return inherited_verdict(event)
    why = f"{verdict.why.split(':', 1)[0]}: {_listed(tuple(own))}"
    details = "\n".join([why, f"not counted, inherited from {event.left_by or 'start-up'}:",
                         *(f"  {p}" for p in event.problems)])
    invariant = own[0][1:].split("]", 1)[0]
    return Verdict.failed(f"{KV_LEDGER}.{invariant}", why, at=-1, details=details)
