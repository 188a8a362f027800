"""Every ``HIL_*`` environment variable the harness, its tools and setup.sh read, declared once:
its value type, the option it sets (when it is a pytest option's and a ``hil`` command's
variable), and whether it is internal (set by the harness for its own child processes, never
by a user).

The options' variables get their help from harness/plugin/options.py; the others are described
here. A layer above core declares the variables it owns with ``register_variables``: the kind
registry (harness/targets/__init__.py) registers each target kind's ``variables`` when it loads,
so a kind's variables are declared in its own package, once. docs/configuration.md lists them
all (tests/unit/core/test_settings.py checks that every variable read anywhere is declared,
and every user-facing one documented).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from harness.core.settings.values import SettingError, ValueType, choice, parse, value_type


@dataclass(frozen=True)
class Variable:
    """One ``HIL_*`` variable: its type, the option it sets (or None), and what it is for."""

    name: str
    kind: str | ValueType
    option: str | None = None
    internal: bool = False
    doc: str = ""  # for a variable without an option (an option's help says the rest)

    @property
    def value_type(self) -> ValueType:
        return value_type(self.kind)

    def where(self) -> str:
        return f"{self.name} (option {self.option})" if self.option else self.name


def _opt(name: str, kind: str, option: str) -> Variable:
    return Variable(name, kind, option=option)


def _internal(name: str, doc: str) -> Variable:
    return Variable(name, "text", internal=True, doc=doc)


# The engine start modes of harness/engine/forkserver.py (MODES; a unit test keeps them equal).
ENGINE_START_MODES = ("platform", "preload", "fresh")

# Extended in place by register_variables (a kind's variables), never rebound: a module that
# imported it sees every registered variable.
VARIABLES: list[Variable] = [
    # The pytest options' variables (harness/plugin/options.py), also the hil commands'.
    _opt("HIL_MODEL", "text", "--model"),
    _opt("HIL_TARGET", "text", "--target"),
    _opt("HIL_GEOMETRY", "text", "--geometry"),
    _opt("HIL_REQUIRE_DEVICE", "flag", "--require-device"),
    _opt("HIL_ALLOW_EMULATED_CARD", "flag", "--allow-emulated-card"),
    _opt("HIL_NO_ENGINE_REPLACE", "flag", "--no-engine-replace"),
    _opt("HIL_CACHE_DIR", "writable-folder", "--hil-cache-dir"),
    _opt("HIL_REPORTS_DIR", "writable-folder", "--hil-reports-dir"),
    _opt("HIL_INVENTORY", "path", "--inventory"),
    _opt("HIL_LEASE_DIR", "path", "--lease-dir"),
    _opt("HIL_SHARD", "shard", "--shard"),
    _opt("HIL_SHARD_DURATIONS", "path", "--shard-durations"),
    _opt("HIL_QUARANTINE", "path", "--quarantine"),
    _opt("HIL_STRICT_QUARANTINE", "flag", "--strict-quarantine"),
    _opt("HIL_STACK", "text", "--stack"),
    _opt("HIL_HOST_PYTHON", "path", "--python"),
    _opt("HIL_DEVICE_ROOT", "folder", "--device-root"),
    _opt("HIL_ENGINE_START_TIMEOUT", "seconds", "--engine-start-timeout"),
    _opt("HIL_ALLURE_ATTACH_PASSED", "flag", "--allure-attach-passed"),
    _opt("HIL_NO_TRIAGE", "flag", "--no-triage"),
    _opt("HIL_TRIAGE_MAX", "whole", "--triage-max"),
    _opt("HIL_TRIAGE_BUDGET", "seconds", "--triage-budget"),
    # Read where they are used, by a user's choice.
    Variable("HIL_ENGINE_START", choice(*ENGINE_START_MODES),
             doc="how engine processes start: platform (the default: a forked preloaded parent"
             " where the platform allows), preload or fresh (harness/engine/forkserver.py)"),
    Variable("HIL_FAULTS", "text",
             doc="faults (harness/in_engine/faults/) an engine installs, separated by ';'; set"
             " per device in an inventory's env table (--inject-fault sets them for all); in"
             " the environment of a run it is refused, unless --allow-external-faults declares it"
             " as the run's --inject-fault"),
    Variable("HIL_FULL_PROBE_MAX_BLOCKS", "whole",
             doc="KV probe: above this many blocks a snapshot is a delta (default 4096; 0:"
             " always)"),
    Variable("HIL_PROBE_CHECKPOINT_EVERY", "whole",
             doc="KV probe: a full snapshot at least every this many delta snapshots (default"
             " 32; more on large pools)"),
    Variable("HIL_ALLURE", "path",
             doc="the Allure 2 binary `hil report` runs (default: the one ./setup.sh installs,"
             " else allure on PATH)"),
    Variable("HIL_BUILD_NAME", "text", doc="the report's build name (CI runs)"),
    Variable("HIL_BUILD_URL", "text", doc="the report's link to the CI build"),
    Variable("HIL_REPORT_URL", "text", doc="the report's link to the published report"),
    Variable("HIL_DEVICE_INSTANCE", "text",
             doc="the device instance a report names (default: from the engine environment)"),
    Variable("HIL_PYTHON", "path",
             doc="the Python ./setup.sh and stack installs create venvs with (a stack on a"
             " vendor SDK: the SDK environment's python)"),
    Variable("HIL_CARD_HOST_DIR", "path",
             doc="tools/card-host/run.sh: its work folder (default .hil-cache/card-host)"),
    Variable("HIL_CARD_HOST_BASE_PYTHON", "path",
             doc="tools/card-host/run.sh: the Python the card image's venv is made from"),
    Variable("HIL_CARD_HOST_RUN_DIR", "path",
             doc="tools/card-host/run.sh: the run's folder (default WORK/run)"),
    Variable("HIL_CARD_HOST_CACHE_DIR", "path",
             doc="tools/card-host/run.sh: the host's cache, keyed by content (default WORK/cache)"),
    Variable("HIL_CARD_HOST_NO_DEVICES_CHECK", "flag",
             doc="tools/card-host/run.sh: skip its `hil devices` pre-flight"),
    Variable("HIL_CARD_HOST_WORKERS", "count",
             doc="tools/card-host/run.sh: pytest-xdist workers of its runs (default 2)"),
    Variable("HIL_CARD_HOST_CARDS", "count",
             doc="tools/card-host/run.sh: the fake host's cards (default 2)"),
    Variable("HIL_CARD_HOST_GROUP", "count",
             doc="tools/card-host/run.sh: declare a group of its first N cards (default 0: none)"),
    # Set by the harness for its own child processes.
    _internal("HIL_ENGINE_AUTHKEY", "the engine process's connection key (engine host)"),
    _internal("HIL_FORKSERVER_AUTHKEY", "the preloaded parent's connection key (forkserver)"),
    _internal("HIL_FORKSERVER_KIND_MODULES",
              "the kinds' plugin preload maps and engine modules, for the preloaded parent"),
    _internal("HIL_DEVICE_ID", "the leased device an engine runs on (lab leases)"),
    _internal("HIL_DEVICE_CARDS", "a group lease's devices, in rank order (lab leases)"),
    _internal("HIL_ENGINE_THREADS", "the threads an engine computes with: its share of the cores"),
    _internal("HIL_FORKSERVER_SHARE",
              "the run's folder of shared preloaded parents (forkserver; this checkout's tests)"),
    _internal("HIL_FORKSERVER_OWNER", "the process the shared preloaded parents stop with"),
    _internal("HIL_FAULT_STATE_DIR", "the run's fault-state folder (engine pool)"),
    _internal("HIL_CARD_ADDRESS", "the card address the on-card verification expects"),
    _internal("HIL_ALLOW_EXTERNAL_FAULTS", "set from --allow-external-faults for engines"),
    _internal("HIL_RANK_ENGINE_CONFIG", "a tensor-parallel engine's configuration, for its ranks"),
    _internal("HIL_RANK_ENGINE_PID", "the engine process that shared it with its ranks"),
    _internal("HIL_BIND_PORTS", "the variables an engine fills with a port it picks as it starts"),
    _internal("HIL_PORTS_AVOID", "the ports an engine's earlier start found taken (engine pool)"),
]

BY_VARIABLE: dict[str, Variable] = {v.name: v for v in VARIABLES}
BY_OPTION: dict[str, Variable] = {v.option: v for v in VARIABLES if v.option}
CORE = "harness.core.settings"
# Who declared each variable (CORE, or the owner given to register_variables).
DECLARED_BY: dict[str, str] = dict.fromkeys(BY_VARIABLE, CORE)


def register_variables(variables: Iterable[Variable], owner: str) -> None:
    """Declare ``variables``, owned by ``owner`` (a target kind's name): each joins VARIABLES,
    BY_VARIABLE and, with an option, BY_OPTION. The same declaration by the same owner again
    changes nothing; a name or an option declared otherwise raises ValueError naming both."""
    for var in variables:
        known = BY_VARIABLE.get(var.name)
        if known is not None:
            if known == var and DECLARED_BY[var.name] == owner:
                continue
            raise ValueError(f"{var.name} is declared by {DECLARED_BY[var.name]} and again by"
                             f" {owner}; declare each variable once")
        if var.option is not None and var.option in BY_OPTION:
            raise ValueError(f"{var.name} ({owner}) sets option {var.option}, which"
                             f" {BY_OPTION[var.option].name} sets already")
        VARIABLES.append(var)
        BY_VARIABLE[var.name] = var
        DECLARED_BY[var.name] = owner
        if var.option is not None:
            BY_OPTION[var.option] = var


def env_value(name: str, environ: Mapping[str, str] | None = None, default: Any = None) -> Any:
    """The value of the declared variable ``name`` read as its type; ``default`` when it is
    unset or empty. SettingError names the variable (and its option) when the value is bad;
    paths are read as text (what they name is checked where they are used)."""
    var = BY_VARIABLE[name]
    raw = (os.environ if environ is None else environ).get(name)
    if raw is None or not raw.strip():
        return default
    return parse(var.kind, raw, var.option, var.name, on_disk=False)


def env_problems(environ: Mapping[str, str] | None = None,
                 names: tuple[str, ...] | None = None) -> list[SettingError]:
    """The set, user-facing variables (all, or those in ``names``) whose values their types
    refuse: what a run checks once at its start."""
    problems = []
    for var in VARIABLES:
        if var.internal or (names is not None and var.name not in names):
            continue
        try:
            env_value(var.name, environ)
        except SettingError as e:
            problems.append(e)
    return problems
