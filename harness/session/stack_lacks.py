"""What a stack's software does not have: the target variants and suites no test of it runs.

Two sources say it. A pinned stack's file (``stacks/<name>.toml``): ``[targets.unsupported]``
(variant = why), ``[targets] supported`` (a variant not listed), ``[suites.unsupported]``
(suite marker = why); the default and the host stack run as they are, so their files are not
applied here. And each kind's ``stack_feature_problem`` hook: a plugin generation without a
mode (sendnn-inference 2.x has no continuous batching), on any stack.

A run collects only what its stack has (``harness.plugin.stack_variants``) and says once per
stack what it lacks: in the run summary, the report's environment and the terminal summary.
A device this host lacks (a card absent) is not a stack's lack: such tests are collected and
skip saying what is missing.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field

from harness.stacks import host as host_stack
from harness.stacks.spec import StackError, list_stacks, load_stack
from harness.targets import KINDS, all_variants
from harness.targets.variants import TargetVariant

SUITE = "suite "  # the subject of a suite the stack lacks: "suite capacity"


@dataclass(frozen=True)
class Lack:
    """One thing a stack does not have: the message a test of it would skip with
    (``X does not run on stack S: WHY``) and the short reason the summaries show."""

    message: str
    reason: str


@dataclass(frozen=True)
class StackLacks:
    """What stack ``stack`` does not have, by subject: a variant id (in the registry's order),
    then ``suite NAME`` for each suite (in the stack file's order)."""

    stack: str
    entries: dict[str, Lack] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.entries)

    def subject(self, variant: TargetVariant, markers: Iterable[str] = ()) -> str | None:
        """What a test with ``markers`` on ``variant`` needs that this stack lacks: a suite
        first, then the variant; None when the stack has both."""
        for m in markers:
            if SUITE + m in self.entries:
                return SUITE + m
        return variant.id if variant.id in self.entries else None

    def problem(self, variant: TargetVariant, markers: Iterable[str] = ()) -> str | None:
        """Why a test with ``markers`` on ``variant`` does not run on this stack, or None."""
        subject = self.subject(variant, markers)
        return None if subject is None else self.entries[subject].message

    def reasons(self, subjects: Iterable[str] | None = None) -> list[tuple[list[str], str]]:
        """(subjects, reason), the subjects of one reason together, in order; all of them, or
        those of ``subjects``."""
        wanted = list(self.entries) if subjects is None else list(subjects)
        grouped: dict[str, list[str]] = {}
        for subject in wanted:
            grouped.setdefault(self.entries[subject].reason, []).append(subject)
        return [(names, reason) for reason, names in grouped.items()]

    def lines(self) -> list[str]:
        """One line per reason: ``a, b: reason``."""
        return [f"{', '.join(names)}: {reason}" for names, reason in self.reasons()]


def _reason(message: str, subject: str, stack: str) -> str:
    """The reason in a kind's message ``SUBJECT does not run on stack S: REASON``."""
    return message.removeprefix(f"{subject} does not run on stack {stack}: ")


@functools.cache
def stack_lacks(stack: str) -> StackLacks:
    """What ``stack`` lacks (for a stack without a file, what the kinds say: the host stack; an
    unknown one is refused elsewhere with its own message). Cached per stack: the stack files
    and the kinds' plugins do not change during a run."""
    spec = None
    if stack != host_stack.HOST:
        try:
            spec = load_stack(stack)
        except StackError:
            spec = None
    declared = spec.unsupported if spec is not None else {}
    applied = spec is not None and not host_stack.is_unpinned(stack)
    lacks = StackLacks(stack)
    for vid, variant in all_variants().items():
        if applied and vid in declared:
            lacks.entries[vid] = Lack(f"{vid} does not run on stack {stack}: {declared[vid]}",
                                      declared[vid])
        elif applied and spec.targets and vid not in spec.targets:
            lacks.entries[vid] = Lack(f"{vid} is not among the targets of stack {stack}",
                                      f"not among the targets of stack {stack}")
        else:
            message = KINDS[variant.target].stack_feature_problem(variant, stack)
            if message:
                # The stack file's word for it where it has one: shorter than the kind's.
                lacks.entries[vid] = Lack(message, declared.get(vid)
                                          or _reason(message, vid, stack))
    if applied:
        for suite, why in spec.unsupported_suites.items():
            lacks.entries[SUITE + suite] = Lack(
                f"suite {suite} does not run on stack {stack}: {why}", why)
    return lacks


def stacks_having(subject: str) -> list[str]:
    """The stacks of ``stacks/`` that have ``subject`` (a variant id: those whose file lists it
    among their targets; ``suite NAME``: those that do not lack it), the default first."""
    out = []
    for name in list_stacks():
        try:
            spec = load_stack(name)
        except StackError:
            continue
        if subject in stack_lacks(name).entries:
            continue
        if subject.startswith(SUITE) or subject in spec.targets:
            out.append(name)
    return out
