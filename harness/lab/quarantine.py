"""Quarantine: known failures that run and report as known instead of failing the night.

The list is a checked-in TOML file, one entry per known failure:

    [[known]]
    test = "suites/test_token_equality.py::test_greedy_tokens_equal_reference[*-spyre-sendnn-cp-long-prompt]"
    reason = "sendnn cp diverges on 190-token prompts"
    issue = "https://tracker.example/ISSUE-123"

``test`` is a node id, where ``*`` and ``?`` are wildcards. A quarantined test runs as a
non-strict xfail: a failure shows as known (XFAIL, with reason and issue); a
pass (XPASS) is reported at the end with a warning to lift the quarantine. An entry with
``stacks = ["default"]`` holds only in runs on those stacks (a bug of one plugin generation:
the same test on another stack must pass); in a run on another stack it is not judged. One with
``cpu_lacks = ["avx512f"]`` holds only on hosts whose CPU lacks those flags (a failure of the
kernels a stack picks on such hosts); on other hosts it is not judged either.

An entry may instead (or also) name a verdict of ``hil explore``, which has no test id: its
``check`` (``kv_ledger.promises``), ``targets`` (target variant id prefixes, ``["spyre-"]``),
``why`` (a regular expression searched for in the verdict's first line) and ``when`` (named
conditions of the example, ``harness.lab.known_conditions.CONDITIONS``); ``stacks`` and ``cpu_lacks``
hold for it too. The suites read the entries that name a test (``load_quarantine``), the
explorer those that name a check (``load_known_verdicts``); both check every entry.

A test listed twice is refused (which reason holds?). An entry that matches no collected test
(its test was renamed, or it never matched) is a warning, and refused under
--strict-quarantine; ``judge_quarantine`` says which entries it can judge in a run narrowed by
-m, -k, --shard, --target, --model or by the suite files named (see its doc). Entries are
judged against the whole suite, not the selection: the tests -m, -k and --shard deselect count,
and a file named with node ids (``FILE::test``) counts with all its tests. An entry that
matches every test of the suite (``*``, ``suites/*``...) is refused: it would hide every
failure (``matches_every_test``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness.core.strict_files import read_toml
from harness.lab.schemas import QUARANTINE_SCHEMA, check


@dataclass(frozen=True)
class KnownFailure:
    test: str
    reason: str
    issue: str
    where: str = field(default="", compare=False)  # "FILE: known #N" in messages
    stacks: tuple[str, ...] = ()  # the stacks it holds on; () for every stack
    # CPU flags (/proc/cpuinfo) the host must lack for it to hold: a failure of the kernels a
    # stack picks on such hosts only (vLLM's CPU platform loads other kernels per ISA).
    cpu_lacks: tuple[str, ...] = ()
    # An explorer verdict it holds for (``check``; "" for none): on target variants whose id
    # starts with one of ``targets`` (all: ()), whose first line ``why`` (a regex) is found in
    # (any: ""), where each named condition of ``when`` holds (harness.lab.known_conditions).
    check: str = ""
    targets: tuple[str, ...] = ()
    why: str = ""
    when: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """What names the entry in messages: its test, else its check."""
        return self.test or self.check

    def holds_for_verdict(self, check: str, first_line: str, variant: str, stack: str,
                          cpu_flags: frozenset[str] | None = None) -> bool:
        """Whether the entry holds for a failed explorer verdict of ``check`` whose first line
        is ``first_line``, on target variant ``variant`` and ``stack``: all but its named
        conditions (``when``), which need the example (harness.lab.known_conditions holds them; harness.explore.known judges a verdict by them)."""
        return (bool(self.check) and check == self.check
                and (not self.targets or variant.startswith(self.targets))
                and (not self.why or re.search(self.why, first_line) is not None)
                and self.holds_on(stack, cpu_flags))

    def holds_on(self, stack: str, cpu_flags: frozenset[str] | None = None) -> bool:
        """Whether the entry holds in a run on ``stack``, on a host with ``cpu_flags`` (None:
        this host's)."""
        return self.why_not(stack, cpu_flags) is None

    def why_not(self, stack: str, cpu_flags: frozenset[str] | None = None) -> str | None:
        """Why the entry does not hold in a run on ``stack`` on this host, or None."""
        if self.stacks and stack not in self.stacks:
            return f"it holds on stack(s) {', '.join(self.stacks)}, this run is on {stack!r}"
        if self.cpu_lacks:
            flags = host_cpu_flags() if cpu_flags is None else cpu_flags
            has = [f for f in self.cpu_lacks if f in flags]
            if has:
                return (f"it holds on hosts whose CPU lacks {', '.join(self.cpu_lacks)}; this"
                        f" host's has {', '.join(has)}")
        return None

    def matches(self, nodeid: str) -> bool:
        # Node ids hold brackets, so only * and ? are wildcards here (unlike fnmatch).
        pattern = re.escape(self.test).replace(r"\*", ".*").replace(r"\?", ".")
        return re.fullmatch(pattern, nodeid) is not None


def host_cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU flags of this host (the first ``flags`` line of /proc/cpuinfo; none where it
    cannot be read)."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("flags"):
                return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def load_quarantine(path: Path, required: bool = False,
                    stacks: Iterable[str] | None = None) -> list[KnownFailure]:
    """The entries of a quarantine file that name a suite test; [] when it does not exist and
    is not ``required`` (a path the user named must exist). ``stacks``: the stack names an
    entry may name (None: any). Every entry is checked, those of explorer verdicts only too
    (``read_entries``). ValueError names the file, entry and fix."""
    return [k for k in read_entries(path, required, stacks) if k.test]


def load_known_verdicts(path: Path, stacks: Iterable[str] | None = None) -> list[KnownFailure]:
    """The entries of a quarantine file that name an explorer verdict (``check``); [] when it
    does not exist. Checked as ``load_quarantine`` checks them."""
    return [k for k in read_entries(path, False, stacks) if k.check]


def read_entries(path: Path, required: bool = False,
                 stacks: Iterable[str] | None = None) -> list[KnownFailure]:
    """Every entry of a quarantine file, each checked (``load_quarantine``)."""
    if not path.exists():
        if required:
            raise ValueError(f"--quarantine: file not found: {path}; pass an existing TOML file"
                             " of [[known]] entries (or /dev/null for none), or leave the option out")
        return []
    if path.is_dir():
        raise ValueError(f"--quarantine: {path} is a folder; pass a TOML file of [[known]] entries")
    # Strictly (harness/core/strict_files.py): a key twice, a byte-order mark or JSON is
    # refused naming the line (FileFormatError, a ValueError).
    data = read_toml(path, "quarantine file")
    check(data, QUARANTINE_SCHEMA, str(path), item_names={"known": "test"})
    names = None if stacks is None else sorted(stacks)
    known: list[KnownFailure] = []
    first: dict[str, int] = {}
    for n, e in enumerate(data.get("known", []), 1):
        label = e.get("test") or e.get("check")
        problem = verdict_problem(e)
        if problem:
            raise ValueError(f"{path}: known #{n}" + (f" ({label!r})" if label else "")
                             + f": {problem}")
        if "test" in e and e["test"] in first:
            raise ValueError(f"{path}: known #{n} ({e['test']!r}): test listed twice (also known"
                             f" #{first[e['test']]}); keep one entry, with the reason that holds")
        if "test" in e:
            first[e["test"]] = n
        named = tuple(e.get("stacks", ()))
        unknown = [s for s in named if names is not None and s not in names]
        if unknown:
            raise ValueError(f"{path}: known #{n} ({label!r}): stacks names {unknown[0]!r},"
                             f" which is no stack (stacks/*.toml: {', '.join(names or [])})")
        known.append(KnownFailure(e.get("test", ""), e["reason"], e["issue"], f"{path}: known #{n}",
                                  named, tuple(e.get("cpu_lacks", ())),
                                  check=e.get("check", ""), targets=tuple(e.get("targets", ())),
                                  why=e.get("why", ""), when=tuple(e.get("when", ()))))
    return known


EXPLORER_KEYS = ("targets", "why", "when")  # what describes an explorer verdict besides its check
_CHECK_ID = re.compile(r"[a-z][a-z0-9_]*(\.[a-z0-9_]+)*")


def verdict_problem(entry: dict[str, Any]) -> str | None:
    """What is wrong with an entry's test and explorer verdict (a schema-checked entry): it
    names neither, its explorer keys come without a check, its check is no check id, its
    ``why`` no regular expression, a condition of ``when`` or a prefix of ``targets`` names
    nothing the explorer knows; None when nothing is."""
    if "test" not in entry and "check" not in entry:
        return ('names neither a test nor a check; add test = "NODE ID" (the suite test it'
                ' holds for) or check = "CHECK" (the hil explore verdict it holds for)')
    loose = [k for k in EXPLORER_KEYS if k in entry]
    if "check" not in entry:
        return (f"{', '.join(loose)} describe{'s' if len(loose) == 1 else ''} a hil explore"
                ' verdict, and the entry names no check; add check = "CHECK" (the failed'
                " verdict's check, e.g. kv_ledger.promises) or remove them") if loose else None
    if not _CHECK_ID.fullmatch(entry["check"]):
        return (f"check {entry['check']!r} is no check id (a name such as kv_ledger.promises"
                " or engine_error: lower-case words joined by '_' and '.'); fix it")
    if "why" in entry:
        try:
            re.compile(entry["why"])
        except re.error as e:
            return (f"why {entry['why']!r} is no regular expression ({e}); fix it (it is"
                    " searched for in the verdict's first line: escape ( [ . * + ? as \\( ...)")
    if "when" in entry:  # deferred imports: read for the entries of explorer verdicts only
        from harness.lab.known_conditions import CONDITIONS

        unknown = [c for c in entry["when"] if c not in CONDITIONS]
        if unknown:
            return (f"when names {unknown[0]!r}, which is no condition hil explore knows"
                    f" ({', '.join(CONDITIONS)}); use one of them, or say it of the verdict's"
                    ' first line with why = "REGEX"')
    if "targets" in entry:
        from harness.targets.variants import VARIANTS

        none = [t for t in entry["targets"] if not any(v.startswith(t) for v in VARIANTS)]
        if none:
            return (f"targets names {none[0]!r}, which starts no target variant's id"
                    f" ({', '.join(VARIANTS)}); give the start of one (e.g. 'spyre-')")
    return None


# The entry that quarantined each test of this process's last collection (node id -> entry):
# a failure's triage asks it (``quarantined_by``) without reaching for the pytest item.
_APPLIED: dict[str, KnownFailure] = {}


def apply_quarantine(items: list[Any], known: list[KnownFailure]) -> None:
    """Mark each of ``items`` that an entry of ``known`` matches as a non-strict xfail (the
    first entry that matches), and remember the entry for ``quarantined_by``."""
    _APPLIED.clear()
    for item in items:
        for k in known:
            if k.matches(item.nodeid):
                item.add_marker(pytest.mark.xfail(
                    reason=f"quarantined: {k.reason} ({k.issue})", strict=False))
                item.user_properties.append(("quarantine", k.issue))
                _APPLIED[item.nodeid] = k
                break


def quarantined_by(nodeid: str) -> KnownFailure | None:
    """The entry that quarantined test ``nodeid`` in this process's collection (on this run's
    stack), or None when the test is not quarantined."""
    return _APPLIED.get(nodeid)


def quarantined_passes(terminalreporter: Any) -> list[str]:
    """Node ids of quarantined tests that passed (XPASS) in this run."""
    return [r.nodeid for r in terminalreporter.stats.get("xpassed", [])
            if "quarantined:" in str(getattr(r, "wasxfail", ""))]


# ------------------------------------------------------------------ entries that match nothing

_STAR = object()  # a wildcard in a glob of tokens: any text, empty too
_ANY = object()  # one character


def _tokens(pattern: str) -> tuple[object, ...]:
    return tuple(_STAR if c == "*" else _ANY if c == "?" else c for c in pattern)


def _generalized(nodeid: str, holes: Sequence[str]) -> tuple[object, ...]:
    """``nodeid`` as a glob whose parameter ids in ``holes`` (its target variant, its model)
    are wildcards: the node ids the same test has in runs of other targets and models."""
    head, bracket, params = nodeid.partition("[")
    out: list[object] = list(head + bracket)
    holes = sorted((h for h in holes if h), key=len, reverse=True)
    i = 0
    while i < len(params):
        hit = next((h for h in holes if params.startswith(h, i)), None)
        if hit:
            out.append(_STAR)
            i += len(hit)
        else:
            out.append(params[i])
            i += 1
    return tuple(out)


def globs_meet(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    """Whether some node id matches both globs (tokens of ``_tokens``/``_generalized``)."""

    seen: set[tuple[int, int]] = set()
    todo = [(0, 0)]
    while todo:  # a walk over (position in a, position in b); no recursion for long ids
        i, j = todo.pop()
        if (i, j) in seen:
            continue
        seen.add((i, j))
        if i == len(a) and j == len(b):
            return True
        if i < len(a) and a[i] is _STAR:
            todo += [(i + 1, j)] + ([(i, j + 1)] if j < len(b) else [])
        if j < len(b) and b[j] is _STAR:
            todo += [(i, j + 1)] + ([(i + 1, j)] if i < len(a) else [])
        if i < len(a) and j < len(b) and a[i] is not _STAR and b[j] is not _STAR \
                and (a[i] is _ANY or b[j] is _ANY or a[i] == b[j]):
            todo.append((i + 1, j + 1))
    return False


@dataclass
class QuarantineCheck:
    """The entries that match no collected test, and those this run cannot judge (why)."""

    unmatched: list[tuple[KnownFailure, str]] = field(default_factory=list)
    not_judged: list[tuple[KnownFailure, str]] = field(default_factory=list)

    def warnings(self) -> list[str]:
        return [f"{k.where or 'quarantine'} ({k.test!r}) matches no collected test: {why};"
                " fix its node id (was the test renamed?) or remove the entry"
                for k, why in self.unmatched]

    def notes(self) -> list[str]:
        return [f"{k.where or 'quarantine'} ({k.test!r}) not judged: {why}"
                for k, why in self.not_judged]


def judge_quarantine(known: Iterable[KnownFailure], collected: Sequence[tuple[str, Sequence[str]]],
                     other_ids: Iterable[str] = ()) -> QuarantineCheck:
    """Which entries match none of ``collected`` ((node id, its variant and model ids): every
    test collected, those -m, -k or --shard deselected too) although they could have.

    An entry is judged only when its file part is a literal file this run collected (a run of
    some suite files leaves the others' entries alone), it names none of ``other_ids`` (target
    variants, models) this run lacks, and no test of the run would match it on another target
    variant or model (its variant and model ids made wildcards). So a renamed test, or a case
    renamed in its parameters, is flagged; an entry for a target or model this run does not
    have is "not judged"."""
    collected = list(collected)
    files = {n.partition("::")[0] for n, _ in collected}
    in_run = {h for _, holes in collected for h in holes if h}
    others = [i for i in other_ids if i not in in_run]
    out = QuarantineCheck()
    for k in known:
        if any(k.matches(n) for n, _ in collected):
            continue
        file, sep, rest = k.test.partition("::")
        params = rest.partition("[")[2]
        if not sep or "*" in file or "?" in file:
            out.not_judged.append((k, "its file part is not one file"))
        elif file not in files:
            out.not_judged.append((k, f"{file} was not collected in this run"))
        elif mentioned := [i for i in others if i in params]:
            out.not_judged.append((k, f"it names {mentioned[0]!r}, not in this run"))
        elif any(globs_meet(_tokens(k.test), g) for g in
                 {_generalized(n, holes) for n, holes in collected if n.startswith(file + "::")}):
            out.not_judged.append((k, "it may match a target variant or model not in this run"))
        else:
            func = rest.partition("[")[0]
            tests = {n.partition("::")[2].partition("[")[0] for n, _ in collected
                     if n.startswith(file + "::")}
            if "*" not in func and "?" not in func and func not in tests:
                out.unmatched.append((k, f"{file} has no test {func!r}"))
            elif "[" not in rest and func in tests:
                out.unmatched.append((k, f"{func} is parametrized: its node ids end in [...];"
                                         " add [*] for all of them, or their parameter ids"))
            else:
                out.unmatched.append((k, f"no test of {file} matches it"))
    return out


# ------------------------------------------------------------------ entries that match everything

# Stands for a parameter id or a test name no entry can name literally: only a wildcard
# matches it.
_UNNAMED = "\x00"


def _ids_unnamed(nodeid: str, holes: Sequence[str]) -> str:
    """``nodeid`` with its target variant and model ids (``holes``) replaced by ``_UNNAMED``:
    the same test on a target or model an entry does not name."""
    return "".join(_UNNAMED if t is _STAR else str(t) for t in _generalized(nodeid, holes))


def matches_every_test(k: KnownFailure, collected: Sequence[tuple[str, Sequence[str]]],
                       suite_files: Iterable[str] = ()) -> bool:
    """Whether entry ``k`` matches every test of the suite: each of ``collected`` ((node id,
    its variant and model ids)), also on every other target variant and model, and any test
    of the suite's other files ``suite_files`` (file parts of node ids) this run did not
    collect. False when nothing was collected, and for an entry without a wildcard: it names
    one test."""
    if not collected or ("*" not in k.test and "?" not in k.test):
        return False
    for nodeid, holes in collected:
        if not (k.matches(nodeid) and k.matches(_ids_unnamed(nodeid, holes))):
            return False
    files = {n.partition("::")[0] for n, _ in collected}
    return all(k.matches(f"{f}::{_UNNAMED}") for f in suite_files if f not in files)


def everything_refusal(entries: Iterable[KnownFailure],
                       collected: Sequence[tuple[str, Sequence[str]]],
                       suite_files: Iterable[str] = ()) -> str | None:
    """The refusal of the first entry that matches every test of the suite
    (``matches_every_test``), or None."""
    files = list(suite_files)
    for k in entries:
        if matches_every_test(k, collected, files):
            return (f"{k.where or 'quarantine'} ({k.test!r}) matches every test of the suite"
                    f" (the {len(collected)} tests of the files collected here, on every target"
                    " and model): a quarantine of everything reports every failure as known;"
                    " name the tests it holds for (a file, a test, its parameter ids)")
    return None
