"""Options that only mean something beside another, declared once: each dependent option,
what it needs, and what the refusal says; and the options a ``hil`` wrapper command sets itself
for the pytest it runs. An option given without what it needs would be ignored silently (a run
that tests, or reports, something other than it says), so it is refused, naming both.

``PYTEST_NEEDS`` are the pytest plugin's (refused at the start, exit 4: options.check_needs),
``COMMAND_NEEDS`` the ``hil`` commands' (exit 2: cli.py). Every other option is declared
independent (``PYTEST_INDEPENDENT``, ``COMMAND_INDEPENDENT``); a unit test keeps each parser's
options and these tables equal, so a new option is placed in one of them when it is added.

``WRAPPER_OWNS`` are the pytest options ``hil run`` (and ``hil nightly``, which runs through
it) and ``hil triage`` give their child pytest themselves: the same option among the user's
pytest arguments would replace theirs (results written where the wrapper never looks, then "no
test result was recorded"), so it is refused naming the wrapper's own option.

Values are looked up by option name (``--stack``) or, for a positional argument, by its
metavar (``SOURCE``). Pure data and functions of values: no pytest, no parser.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.stacks.host import HOST

Values = Mapping[str, Any]


@dataclass(frozen=True)
class Need:
    """``option`` only means something with ``needs`` (as a message names it), which holds in
    a run when ``holds(values)``. ``does`` says what the option does and what this run lacks
    (``{--name}``/``{--name!r}`` are replaced by the values), ``fix`` how to give the need."""

    option: str
    needs: str
    holds: Callable[[Values], bool]
    does: str
    fix: str


@dataclass(frozen=True)
class Owned:
    """A pytest option a ``hil`` command sets for its child pytest: ``use`` is the command's
    own option for it ("" when there is none to use: the command does it already)."""

    option: str
    use: str
    why: str


def _alluredir(v: Values) -> bool:
    return bool(v.get("--alluredir"))


PYTEST_NEEDS: tuple[Need, ...] = (
    Need("--python", "--stack host", lambda v: v.get("--stack") == HOST,
         "it is the Python the engines of the host stack run in, and this run's stack is"
         " {--stack!r}, whose engines run in its own venv",
         "add --stack host (hil run: --stacks host)"),
    Need("--shard-durations", "--shard", lambda v: bool(v.get("--shard")),
         "it balances the shards of --shard I/N by test durations, and this run is not sharded",
         "add --shard I/N"),
    Need("--hil-clean-results", "--alluredir", _alluredir,
         "it empties the --alluredir folder before the first test, and this run writes no"
         " Allure results", "add --alluredir DIR"),
    Need("--allure-attach-passed", "--alluredir", _alluredir,
         "it attaches the evidence to passing tests' Allure results, and this run writes no"
         " Allure results", "add --alluredir DIR"),
    Need("--triage-max", "triage on (no --no-triage)", lambda v: not v.get("--no-triage"),
         "it limits how many failed tests triage re-runs, and --no-triage turns triage off",
         "drop --no-triage"),
    Need("--triage-budget", "triage on (no --no-triage)", lambda v: not v.get("--no-triage"),
         "it limits the seconds triage may spend, and --no-triage turns triage off",
         "drop --no-triage"),
    Need("--lease-wait", "waiting for a leased device (no --lease-share)",
         lambda v: not v.get("--lease-share"),
         "it is how long a worker waits when every device is leased, and --lease-share shares"
         " a device instead of waiting", "drop --lease-share"),
    Need("--no-engine-replace", "engine reuse (no --no-engine-reuse)",
         lambda v: not v.get("--no-engine-reuse"),
         "it keeps an engine an earlier test left dirty for the next test, and"
         " --no-engine-reuse gives every test a fresh engine", "drop --no-engine-reuse"),
    Need("--allow-external-faults", "--inject-fault, --inventory or HIL_FAULTS",
         lambda v: bool(v.get("--inject-fault") or v.get("--inventory")
                        or os.environ.get("HIL_FAULTS", "").strip()),
         "it declares an inherited HIL_FAULTS as this run's faults and lets --inject-fault"
         " and an inventory's env HIL_FAULTS name a module.function outside the harness, and"
         " this run has none of them",
         "add --inject-fault MODULE.FUNCTION (or an --inventory whose HIL_FAULTS names one)"),
)

# Options that mean what they say on their own (a value of each kind, a folder, a limit).
PYTEST_INDEPENDENT = frozenset({
    "--model", "--target", "--geometry", "--require-device", "--allow-emulated-card",
    "--near-tie-topk", "--near-tie-tol", "--no-engine-reuse", "--no-kv-probe",
    "--no-reference-cache", "--hil-cache-dir", "--hil-reports-dir", "--max-live-engines",
    "--inject-fault", "--inventory", "--lease-dir", "--lease-share", "--shard", "--quarantine",
    "--strict-quarantine", "--stack", "--device-root", "--engine-start-timeout", "--hil-plan",
    "--logprob-tol", "--logprob-tol-card", "--no-teacher-forcing", "--no-triage",
    "--engine-timeout",
})
# The kinds declare a near-tie tolerance per backend (--near-tie-tol-sendnn...): independent.
PYTEST_INDEPENDENT_PREFIXES = ("--near-tie-tol-",)

def _names_folder(values: Values) -> bool:
    """Whether ``--model`` names a model folder (not only registered model names)."""
    return any(os.path.isdir(str(m)) for m in values.get("--model") or ())


COMMAND_NEEDS: dict[str, tuple[Need, ...]] = {
    "report": (
        Need("--port", "--serve", lambda v: bool(v.get("--serve")),
             "it is the port --serve serves the report on, and this command does not serve it",
             "add --serve"),
        Need("--results", "a report of one results folder (no SOURCE)",
             lambda v: not v.get("SOURCE"),
             "it names the one results folder a report is made of, and SOURCE... makes a merge"
             " of the sources instead", "give that folder as one more SOURCE"),
    ),
    "nightly": (
        Need("--shard-durations", "--shard", lambda v: bool(v.get("--shard")),
             "it balances the shards of --shard I/N by test durations, and this nightly is not"
             " sharded", "add --shard I/N"),
    ),
    "registry": tuple(
        Need(option, "a model folder in --model", _names_folder,
             f"it is the {what} a model folder is served at, and registered models run in"
             " their entries' own shapes", "give --model FOLDER")
        for option, what in (("--max-model-len", "context"), ("--max-num-seqs", "batch"))
    ),
}

COMMAND_INDEPENDENT: dict[str, frozenset[str]] = {
    "run": frozenset({"--reports-dir", "--stacks"}),
    "suites": frozenset(),
    "nightly": frozenset({"--reports-dir", "--shard", "--inventory", "--stacks", "--explore"}),
    "devices": frozenset({"--root", "--inventory"}),
    "report": frozenset({"--reports-dir", "--output", "--no-history", "--serve"}),
    "selftest": frozenset({"--reports-dir", "--results", "--inventory", "--lease-dir", "--fault",
                           "--root"}),
    "triage": frozenset({"--budget", "--reports-dir"}),
    "bench": frozenset({"--quick", "--parts"}),
    "models": frozenset({"--cache-dir"}),
    "calibrate": frozenset({"--model", "--precision", "--force", "--attn-scale", "--cache-dir",
                            "--reports-dir"}),
    "registry": frozenset({"--model", "--tp", "--reports-dir"}),
    "explore": frozenset({"--target", "--model", "--stack", "--budget", "--seed",
                          "--shrink-budget", "--reports-dir", "--cache-dir", "--inject-fault",
                          "--inventory", "--engine-timeout", "--tensor-parallel", "--confirm"}),
}

_FRESH = ("it writes each run into a fresh folder and replaces the previous results only when"
          " the run completed, so there is nothing to clean")
_RUN_OWNS = (
    Owned("--alluredir", "--reports-dir", "it writes the results into REPORTS/allure-results"
          " (staged, published when the run completed); another --alluredir would send them"
          " where it never looks"),
    Owned("--junitxml", "--reports-dir", "it writes REPORTS/junit.xml (one per stack);"
          " another --junitxml would replace it"),
    Owned("--junit-xml", "--reports-dir", "it writes REPORTS/junit.xml (one per stack);"
          " another --junit-xml would replace it"),
    Owned("--hil-reports-dir", "--reports-dir", "it gives pytest the run's own staging folder"
          " in REPORTS; another --hil-reports-dir would write where it never looks"),
    Owned("--stack", "--stacks", "it runs pytest once per stack of --stacks"),
    Owned("--hil-clean-results", "", _FRESH),
    Owned("--clean-alluredir", "", _FRESH),
)
_TRIAGE_OWNS = (
    Owned("--alluredir", "--reports-dir", "it writes the re-run's results into"
          " REPORTS/triage/<time>-<test>/allure-results and reads them from there"),
    Owned("--junitxml", "--reports-dir", "it writes REPORTS/triage/<time>-<test>/junit.xml and"
          " reads the test's outcome from there"),
    Owned("--junit-xml", "--reports-dir", "it writes REPORTS/triage/<time>-<test>/junit.xml and"
          " reads the test's outcome from there"),
    Owned("--hil-reports-dir", "--reports-dir", "it gives pytest the re-run's own folder"
          " REPORTS/triage/<time>-<test>/ and reads the triage from there"),
    Owned("--triage-budget", "--budget", "it gives the one test's triage its budget"),
    Owned("--triage-max", "", "it triages the one test it re-runs (--triage-max 1)"),
)
WRAPPER_OWNS: dict[str, tuple[Owned, ...]] = {
    "run": _RUN_OWNS, "nightly": _RUN_OWNS, "triage": _TRIAGE_OWNS,
}


# ------------------------------------------------------------------ judging a run's values


def is_independent(option: str) -> bool:
    """Whether the pytest option ``option`` is declared independent."""
    return option in PYTEST_INDEPENDENT or option.startswith(PYTEST_INDEPENDENT_PREFIXES)


def is_given(value: Any, default: Any) -> bool:
    """Whether an option's ``value`` says something its ``default`` does not: not the
    default, and not empty (an empty value, false or 0 asks for nothing)."""
    if value is None or value is False or value == 0 or value in ("", [], ()):
        return False
    return value != default


def fill(text: str, values: Values) -> str:
    """``text`` with ``{--name}`` and ``{--name!r}`` replaced by the values."""
    return text.format_map(_Known(values))


class _Known(dict):
    """The values by name; a name without a value reads as '?' (a message never fails)."""

    def __missing__(self, key: str) -> str:
        return "?"


def _shown_value(value: Any) -> str:
    if value is True:
        return ""  # a flag is named alone
    if isinstance(value, (list, tuple)):
        return " " + ",".join(str(v) for v in value)
    return f" {value!r}" if isinstance(value, str) else f" {value}"


def refusal(need: Need, values: Values, variable: str | None = None) -> str:
    """The message refusing ``need.option`` given without ``need.needs`` (``variable``: the
    environment variable that gave it, when the command line did not)."""
    shown = f"env {variable} (option {need.option})" if variable else need.option
    leave = f"unset {variable}" if variable else f"leave {need.option} out"
    return (f"{shown}{_shown_value(values.get(need.option))} only means something with"
            f" {need.needs}: {fill(need.does, values)}; {need.fix}, or {leave}")


def unmet(needs: Iterable[Need], values: Values, defaults: Values) -> list[Need]:
    """The needs of ``needs`` whose option ``values`` give (``is_given`` against
    ``defaults``) while what it needs does not hold, in declared order."""
    return [n for n in needs
            if is_given(values.get(n.option), defaults.get(n.option)) and not n.holds(values)]


def on_command_line(option: str, args: Sequence[str]) -> bool:
    """Whether ``args`` give ``option`` (``--opt VALUE`` or ``--opt=VALUE``)."""
    return any(a == option or a.startswith(option + "=") for a in args)


def owned_refusal(command: str, extra: Sequence[str]) -> str | None:
    """The message refusing the first pytest option among ``extra`` that ``hil command`` sets
    itself; None when there is none."""
    for owned in WRAPPER_OWNS.get(command, ()):
        if on_command_line(owned.option, extra):
            use = (f"use hil {command}'s own {owned.use} instead" if owned.use else
                   f"leave {owned.option} out")
            return f"{owned.option} is hil {command}'s to set: {owned.why}; {use}"
    return None
