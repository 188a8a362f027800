"""Collection on a stack: only the target variants and suites the run's stack has.

``selection.parametrize`` hands each test's target variants to ``offered``, which leaves out
those the stack lacks (``harness.session.stack_lacks``: its stack file and the kinds' plugin
generations) and records them. A test whose every variant the stack lacks (a suite the stack
does not have) keeps only pytest's empty-parameter placeholder, which ``drop_emptied`` deselects.
A selection that leaves the stack no test at all is refused (``refuse_empty_stack``, pytest's
usage error, exit 4) naming the stack and what it lacks: never a run of nothing that looks
green, nor pytest's bare "no tests ran" (exit 5). It is the stack's doing only where -k and -m
would have selected a test the stack left out (each left-out variant of a test is judged as the
item it would have been: ``Ghost``); a selection of nothing anyway (``-k zzz_nothing``) is
pytest's exit 5, said as "no test was selected".

What the stack lacks is said once, in the terminal summary, the run summary and the report's
environment; a device this host lacks is not filtered here (those tests skip saying so).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from harness.plugin.invocation import is_worker
from harness.plugin.options import option_value
from harness.session.stack_lacks import stack_lacks, stacks_having
from harness.stacks.spec import list_stacks
from harness.targets.variants import TargetVariant

# The subjects (variant ids, ``suite NAME``) this collection left out, in order.
LEFT_OUT_KEY = pytest.StashKey[dict[str, None]]()
# The test functions (node ids without parameters) whose every variant the stack lacks.
EMPTIED_KEY = pytest.StashKey[set[str]]()
# The items the stack's left-out variants would have been (``Ghost``), for -k and -m.
GHOSTS_KEY = pytest.StashKey[list["Ghost"]]()
# How a refusal begins: an xdist controller recognises its workers' refusal by it.
REFUSAL = "--stack "
NOTHING_SELECTED = ("no test was selected (pytest exit 5): -m, -k, --target and the node ids"
                    " leave no test")


@dataclass(frozen=True)
class Ghost:
    """A test's variant the stack left out, as -k and -m would see its item: the names -k
    matches (its file, class, function, parameter ids, variant id, marker names) and the
    names of its markers."""

    names: frozenset[str]
    markers: frozenset[str]

    def selected(self, config: pytest.Config) -> bool:
        """Whether the run's -k and -m select it (True where they cannot be judged: the
        refusal, saying what the stack lacks, is then the safe answer)."""
        try:
            from _pytest.mark.expression import Expression  # deferred: pytest's own parser

            keyword = str(config.option.keyword or "").strip()
            mark = str(config.option.markexpr or "").strip()
            return ((not keyword or Expression.compile(keyword).evaluate(self._keyword))
                    and (not mark or Expression.compile(mark).evaluate(self._mark)))
        except Exception:  # another pytest's parser: judged as selected
            return True

    def _keyword(self, sub: str, /, **_: object) -> bool:
        return any(sub.lower() in name.lower() for name in self.names)

    def _mark(self, name: str, /, **_: object) -> bool:
        return name in self.markers


def _ghost(metafunc: pytest.Metafunc, variant: TargetVariant, markers: list[str]) -> Ghost:
    nodeid = metafunc.definition.nodeid
    parts = nodeid.split("::")
    ids = {str(getattr(c, "id", "")) for c in getattr(metafunc, "_calls", ())} - {""}
    return Ghost(frozenset({parts[0].rsplit("/", 1)[-1], *parts[1:], *ids, variant.id,
                            *markers, *variant.markers}),
                 frozenset([*markers, *variant.markers]))


def run_stack(config: pytest.Config) -> str:
    return str(option_value(config, "--stack") or "default")


def offered(metafunc: pytest.Metafunc, variants: list[TargetVariant]) -> list[TargetVariant]:
    """``variants`` without those the run's stack lacks for this test (its suite markers
    count: a suite the stack lacks takes every variant); what is left out is recorded."""
    config = metafunc.config
    lacks = stack_lacks(run_stack(config))
    if not lacks:
        return variants
    markers = [m.name for m in metafunc.definition.iter_markers()]
    left_out = config.stash.setdefault(LEFT_OUT_KEY, {})
    kept = []
    for v in variants:
        subject = lacks.subject(v, [*markers, *v.markers])
        if subject is None:
            kept.append(v)
        else:
            left_out.setdefault(subject, None)
            config.stash.setdefault(GHOSTS_KEY, []).append(_ghost(metafunc, v, markers))
    if variants and not kept:
        config.stash.setdefault(EMPTIED_KEY, set()).add(metafunc.definition.nodeid)
    return kept


def drop_emptied(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the placeholder items of tests whose every variant the stack lacks."""
    emptied = config.stash.get(EMPTIED_KEY, set())
    if not emptied:
        return
    drop = [i for i in items if i.nodeid.partition("[")[0] in emptied]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [i for i in items if i.nodeid.partition("[")[0] not in emptied]


def empty_stack_refusal(stack: str, left_out: list[str]) -> str:
    """The usage error of a selection that leaves ``stack`` no test: what it lacks of the
    selection, why, and which stacks have it."""
    parts = []
    for subjects, reason in stack_lacks(stack).reasons(left_out):
        found = {s for subject in subjects for s in stacks_having(subject)}
        having = [s for s in list_stacks() if s in found]  # the default first, then by name
        where = (f"stacks that have them: {', '.join(having)}" if having
                 else "no stack file lists them")
        parts.append(f"{', '.join(subjects)} ({reason}; {where})")
    return (f"{REFUSAL}{stack}: no test of this selection runs on stack {stack}: it does not have "
            + "; ".join(parts) + "; and -m, -k, --target or the node ids leave no other test."
            " Name a stack that has them (--stack NAME), or select what this stack runs")


def refuse_empty_stack(session: pytest.Session, config: pytest.Config,
                       items: list[pytest.Item]) -> None:
    """Refuse a collection the stack left empty (exit 4, the reason on the terminal); a
    selection that was empty anyway (no variant left out, or none that -k and -m select) is
    pytest's own exit 5, said as such."""
    left_out = list(config.stash.get(LEFT_OUT_KEY, {}))
    if items:
        return
    ghosts = config.stash.get(GHOSTS_KEY, [])
    if not left_out or (ghosts and not any(g.selected(config) for g in ghosts)):
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None and not is_worker(config):
            reporter.write_line(f"vllm-hil: {NOTHING_SELECTED}")
        return
    refusal = empty_stack_refusal(run_stack(config), left_out)
    if is_worker(config):
        # xdist drops a worker's UsageError unseen: the worker stops the session with this
        # reason, which the controller turns into the usage error (usage_exit_of_empty_stack).
        session.shouldfail = refusal
        return
    raise pytest.UsageError(refusal)


def usage_exit_of_empty_stack(session: pytest.Session) -> None:
    """On an xdist controller whose workers refused an empty collection: pytest's usage error
    (4) with the workers' reason, as without xdist, not the interruption (2) xdist ends it with;
    whose workers selected nothing (exit 5): said as without xdist."""
    dsession = session.config.pluginmanager.getplugin("dsession")
    reason = str(getattr(dsession, "shouldstop", "") or "")
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reason.startswith(REFUSAL) and session.exitstatus == pytest.ExitCode.INTERRUPTED:
        session.exitstatus = pytest.ExitCode.USAGE_ERROR
        if reporter is not None:
            reporter.write_line(f"ERROR: {reason}", red=True)
    elif (dsession is not None and reporter is not None
          and session.exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED):
        reporter.write_line(f"vllm-hil: {NOTHING_SELECTED}")


def lacks_lines(config: pytest.Config) -> list[str]:
    """The terminal summary's lines: what the run's stack lacks, not collected, by reason."""
    lacks = stack_lacks(run_stack(config))
    if not lacks:
        return []
    return [f"stack {lacks.stack} does not have (not collected):",
            *(f"  {line}" for line in lacks.lines())]
