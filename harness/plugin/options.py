"""The plugin's pytest options, each declared once: name, default, value type, help and
``HIL_*`` environment variable; the ``hil`` commands declare their shared arguments from them.

``add_options`` registers them (hooks.py's and allure_report.py's ``pytest_addoption``);
``option_value`` reads one. An option's value is the command line's; without it, its environment
variable's (``env_default``, evaluated when the option is registered, as argparse default);
without that (or when the variable is empty), its declared default. In a session that does not
ask for the harness (activation.py), the generic names (``opts_in=False``: ``--model``,
``--target``...) are not registered, so another project's options of those names still work.

Values are typed by the settings layer (harness/core/settings/): an option declares its
``kind``, an option with a variable takes the variable's type from the registry there. A bad
command-line value is refused by argparse, naming the option; a bad variable never breaks the
registration (``pytest --help`` still works): it becomes an ``EnvProblem`` default that
``check_settings`` refuses at ``pytest_configure``, naming the variable and its option. Paths
are checked for what they name (a writable folder...) there too, once the run is known to be
the harness's.

The defaults that are also another module's defaults are that module's constants, imported
here: a value is written once. What the kinds declare (engine-start limits, the backends with a
wider near-tie tolerance, each its own ``--near-tie-tol-BACKEND``) comes from the registry.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fixtures.models import MODEL_SPECS
from harness.checks.logprobs import TOL_CARD, TOL_FP32
from harness.core.comparison import NEAR_TIE_PROB_TOL, NEAR_TIE_TOP_K
from harness.core.settings import (
    BY_OPTION,
    BY_VARIABLE,
    SettingError,
    ValueType,
    parse,
    value_type,
)
from harness.engine.host import CALL_TIMEOUT, START_TIMEOUT
from harness.engine.pool import MAX_LIVE_ENGINES
from harness.geometry.catalog import DEFAULT_GEOMETRY
from harness.lab.lease_files import default_lease_dir
from harness.plugin.option_needs import PYTEST_NEEDS, on_command_line, refusal, unmet
from harness.stacks.host import default_stack
from harness.targets import all_modes, engine_kinds, near_tie_tolerances, start_timeouts
from harness.targets.variants import VARIANTS
from harness.triage.budget import TRIAGE_BUDGET, TRIAGE_MAX

GROUP = "vllm-hil"  # the --help section of every option here

# Outputs default to the folder pytest runs in, never into an installed or checked-out harness.
HERE = Path.cwd()
DEFAULT_MODELS = ",".join(MODEL_SPECS)
DEFAULT_QUARANTINE = HERE / "quarantine.toml"  # the folder the run starts in
LEASE_WAIT = 600.0  # seconds a worker waits for a leased device

# Who registers an option (its pytest_addoption); each plugin module can be disabled alone.
HOOKS = "hooks"
ALLURE = "allure_report"


@dataclass(frozen=True)
class Option:
    """One pytest option. ``default`` may be a function (called when the option is registered);
    ``env`` is its declared variable (harness/core/settings/variables.py), which, when set and
    not empty, replaces the default (see ``env_default``); ``kind`` is the value type (a name
    of harness.core.settings.TYPES) of an option without a variable."""

    name: str
    help: str
    default: Any = None
    kind: str | ValueType | None = None
    action: str | None = None  # "store_true", "append"
    metavar: str | None = None
    plugin: str = HOOKS
    # Given on the command line, asks for the harness in a session (activation.py); false for
    # the generic names another project's suite may use for options of its own.
    opts_in: bool = True

    @property
    def env(self) -> str | None:
        """The option's variable, as the registry pairs them (harness/core/settings/variables.py
        declares each variable with its option and type, once)."""
        var = BY_OPTION.get(self.name)
        return var.name if var else None

    def declared_default(self) -> Any:
        return self.default() if callable(self.default) else self.default

    @property
    def value_type(self) -> ValueType:
        """The option's type: its variable's when it has one, else its ``kind``; a flag's is
        a yes/no value, an untyped option's any text."""
        if self.env:
            return BY_VARIABLE[self.env].value_type
        if self.kind is not None:
            return value_type(self.kind)
        return value_type("flag" if self.action == "store_true" else "text")

    def where(self) -> str:
        """How a message about the option's variable names it."""
        return f"env {self.env} (option {self.name})"


@dataclass(frozen=True)
class EnvProblem:
    """The default of an option whose variable holds a value its type refuses: registered in
    its place (registration never fails), refused when the run reads the option."""

    message: str

    def __str__(self) -> str:
        return self.message


def env_default(opt: Option, default: Any = None, on_disk: bool = False,
                flag: str | None = None) -> Any:
    """The value of ``opt`` when the command line does not give it: its environment variable's
    (read as its type: a flag's is a yes/no value; with ``on_disk``, a path is checked for what
    it names), else ``default`` or its declared default. A value the type refuses gives an
    ``EnvProblem`` (never an exception) naming the variable and the option (as ``flag``)."""
    fallback = opt.declared_default() if default is None else default
    raw = os.environ.get(opt.env) if opt.env else None
    if raw is None or not raw.strip():
        return fallback
    try:
        return parse(opt.value_type, raw, flag or opt.name, opt.env, on_disk=on_disk)
    except SettingError as e:
        return EnvProblem(f"{e}; fix or unset {opt.env}")


def argparse_type(opt: Option, on_disk: bool = False,
                  empty_ok: bool | None = None) -> Callable[[str], Any] | None:
    """The argparse ``type`` of ``opt``: its value type's parser, refusing a bad value with
    the accepted form (argparse names the option). Empty is "not given" for an option whose
    default is empty (``empty_ok``; by default its declared one). None for flags, lists and
    plain text."""
    t = opt.value_type
    if opt.action is not None or t.name == "text":
        return None
    if empty_ok is None:
        empty_ok = opt.declared_default() == ""

    def convert(raw: str) -> Any:
        if empty_ok and raw == "":
            return ""
        try:
            return parse(t, raw, opt.name, on_disk=on_disk)
        except SettingError as e:
            raise argparse.ArgumentTypeError(e.detail) from None

    convert.__name__ = t.name
    return convert


OPTIONS: tuple[Option, ...] = (
    Option("--model", opts_in=False, default=DEFAULT_MODELS,
           help="comma-separated models: tiny-llama, tiny-granite (built offline) or local"
           f" model folders; env HIL_MODEL; default {DEFAULT_MODELS}"),
    Option("--target", opts_in=False, default="",
           help=f"comma-separated target variants or kinds ({', '.join(VARIANTS)}; or"
           f" {', '.join([*engine_kinds(), *all_modes()])}); default all; env HIL_TARGET"),
    Option("--geometry", default="",
           help="comma-separated named engine geometries"
           " (fixtures/geometries.toml, and an inventory's [geometry.NAME]): the suites that take one run on each that applies to them; the"
           f" others run where {DEFAULT_GEOMETRY!r} is selected; default {DEFAULT_GEOMETRY};"
           " env HIL_GEOMETRY"),
    Option("--require-device", action="store_true", default=False,
           help="fail, instead of skip, a test whose device is missing (nightlies)"),
    Option("--allow-emulated-card", action="store_true", default=False,
           help="let device engines run on an emulated vendor runtime (the emulated card host);"
           " each such result is marked 'emulated' in the report. Without it an engine on the"
           " emulated runtime fails its test"),
    Option("--near-tie-topk", kind="top-k", default=NEAR_TIE_TOP_K,
           help="near-tie rule: each differing token must be in the other side's top-k"
           f" (default {NEAR_TIE_TOP_K})"),
    Option("--near-tie-tol", kind="probability", default=NEAR_TIE_PROB_TOL,
           help="near-tie rule: max probability gap between the two tokens, in both"
           f" distributions (default {NEAR_TIE_PROB_TOL:g})"),
    Option("--no-engine-reuse", action="store_true", default=False,
           help="start a fresh engine for every test (baseline for benchmarks)"),
    Option("--no-engine-replace", action="store_true", default=False,
           help="keep an engine an earlier test left dirty (e.g. a card that cannot be"
           " restarted within the run): later tests report it as inherited_state instead"
           " of running on a fresh engine (env HIL_NO_ENGINE_REPLACE)"),
    Option("--no-kv-probe", action="store_true", default=False,
           help="skip the per-step KV snapshots (benchmarks; KV invariant checks then fail)"),
    Option("--no-reference-cache", action="store_true", default=False,
           help="recompute every reference output (baseline for benchmarks)"),
    Option("--hil-cache-dir", default=str(HERE / ".hil-cache"),
           help="models, reference outputs and engine caches (env HIL_CACHE_DIR)"),
    Option("--hil-reports-dir", default=str(HERE / "reports"),
           help="engine logs and run statistics (env HIL_REPORTS_DIR)"),
    Option("--max-live-engines", kind="count", default=MAX_LIVE_ENGINES,
           help=f"engines kept alive at once per worker (default {MAX_LIVE_ENGINES})"),
    Option("--inject-fault", action="append", default=list, metavar="FAULT[:k=v,...]",
           help="install a fault (harness/in_engine/faults/) in every engine (variant=ID or"
           " stack=NAME: only in those), to prove the checks fail; repeatable. A HIL_FAULTS in"
           " the environment is refused (unless --allow-external-faults declares it): faults"
           " are named by this option or an inventory"),
    Option("--allow-external-faults", action="store_true", default=False,
           help="declare an inherited HIL_FAULTS as this run's --inject-fault specs, and"
           " allow --inject-fault and an inventory's HIL_FAULTS to name a module.function"
           " outside harness/in_engine/faults/ (it is imported and run)"),
    Option("--hil-clean-results", action="store_true", default=False,
           help="empty --alluredir once the arguments are accepted, so a refused run keeps"
           " the previous results (hil run needs none: it writes each run into a fresh folder)"),
    Option("--inventory", opts_in=False, default="",
           help="inventory file (TOML or YAML) listing this host's devices; overrides"
           " discovery (env HIL_INVENTORY)"),
    Option("--lease-dir", default=lambda: str(default_lease_dir()),
           help="folder of device lease locks, owned by you, mode 0700 (env HIL_LEASE_DIR;"
           " default: a per-user folder)"),
    Option("--lease-wait", kind="seconds", default=LEASE_WAIT,
           help="seconds a worker waits for a device when all are leased"
           f" (default {LEASE_WAIT:g})"),
    Option("--lease-share", action="store_true", default=False,
           help="when all devices are leased, share one instead of waiting"),
    Option("--shard", opts_in=False, default="", metavar="I/N",
           help="run only shard I of N (1-based); N hosts with I=1..N run every test once"),
    Option("--shard-durations", default="", metavar="FILE",
           help="balance --shard by these test durations (durations.json"
           " from `hil report`, or a junit xml); default REPORTS_DIR/durations.json when"
           " present, else by test count (env HIL_SHARD_DURATIONS)"),
    Option("--quarantine", opts_in=False, default=str(DEFAULT_QUARANTINE),
           help="known failures: run and reported as known, not failing the run"),
    Option("--strict-quarantine", action="store_true", default=False,
           help="refuse the run when a quarantine entry matches no collected test (without it,"
           " such an entry is a warning; env HIL_STRICT_QUARANTINE)"),
    Option("--stack", opts_in=False, default=default_stack,
           help="the pinned stack (stacks/NAME.toml) whose venv runs the engines; install it"
           " with ./setup.sh --stack NAME; or host: the Python given by --python, as it is"
           " (env HIL_STACK; default: default in a checkout, else host)"),
    Option("--python", opts_in=False, default="", metavar="PATH",
           help="with --stack host: the Python engines run in (default: this one; env"
           " HIL_HOST_PYTHON)"),
    Option("--device-root", default="", metavar="DIR",
           help="read sysfs and /dev below DIR instead of / (a fake card host; env"
           " HIL_DEVICE_ROOT)"),
    Option("--engine-start-timeout", default=None,
           help="seconds an engine may take to start (default per backend: "
           + "".join(f"{what} {t:g}, " for what, t in start_timeouts().items())
           + f"others {START_TIMEOUT:g}; env HIL_ENGINE_START_TIMEOUT)"),
    Option("--hil-plan", action="store_true", default=False,
           help="plan only: record each test's engine configuration (for the test order) and"
           " skip it before any engine starts"),
    *(Option(f"--near-tie-tol-{t.backend}", kind="probability", default=None,
             help=f"near-tie tolerance on the {t.backend} backend ({t.why}; default: twice the"
             " largest probability movement its precision's calibration measured, at least"
             f" --near-tie-tol; {t.default:.2f} where no model is at hand)")
      for t in near_tie_tolerances()),
    Option("--logprob-tol", kind="tolerance", default=None,
           help="logprob closeness on the fp32 CPU paths: max |device - reference| logprob of"
           f" a compared token, in nats (default {TOL_FP32:g})"),
    Option("--logprob-tol-card", kind="tolerance", default=None,
           help="logprob closeness on the reduced-precision (fp16/bf16) backends: a flat max"
           " |device - reference| logprob in nats instead of the precision's calibrated limit"
           f" and band (hil calibrate; {TOL_CARD:g} where no model is at hand)"),
    Option("--no-teacher-forcing", action="store_true", default=False,
           help="skip the teacher-forced run (each request fed the reference's tokens) that"
           " token equality adds to its engine call"),
    Option("--no-triage", action="store_true", default=False,
           help="do not re-run failed token-equality and KV verdicts under varied conditions"
           " (harness/triage/; docs/triage.md)"),
    Option("--triage-max", default=TRIAGE_MAX,
           help="triage at most this many failed tests per pytest process (each xdist worker"
           f" its own; default {TRIAGE_MAX}; 0: none)"),
    Option("--triage-budget", default=TRIAGE_BUDGET,
           help="seconds of triage per pytest process: no triage run starts after them"
           f" (default {TRIAGE_BUDGET:g})"),
    Option("--engine-timeout", kind="seconds", default=CALL_TIMEOUT,
           help="seconds one engine call may take before the engine is killed"),
    Option("--allure-attach-passed", action="store_true", default=False, plugin=ALLURE,
           help="attach the evidence (token diff, KV ledger, scenario, engine log) to passing"
           " tests too, not only to failures (env HIL_ALLURE_ATTACH_PASSED)"),
)

BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}


def _help(opt: Option) -> str:
    return opt.help if not opt.env or opt.env in opt.help else f"{opt.help} (env {opt.env})"


def add_options(parser: pytest.Parser, plugin: str, generic: bool = True) -> None:
    """Register the options ``plugin`` owns, in their declared order; without ``generic``, only
    those that opt in (the generic names stay free for another project's options)."""
    group = parser.getgroup(GROUP)
    for opt in OPTIONS:
        if opt.plugin != plugin or not (generic or opt.opts_in):
            continue
        attrs: dict[str, Any] = {"default": env_default(opt), "help": _help(opt)}
        for key, value in (("type", argparse_type(opt)), ("action", opt.action),
                           ("metavar", opt.metavar)):
            if value is not None:
                attrs[key] = value
        group.addoption(opt.name, **attrs)


_NOTSET = object()


def option_value(config: pytest.Config, name: str, default: Any = _NOTSET) -> Any:
    """The value of the declared option ``name`` (command line, else env_default); ``default``
    when the plugin that registers it is not loaded. A bad variable's value is refused here
    too (``check_settings`` refuses it first)."""
    if name not in BY_NAME:
        raise KeyError(f"{name} is not a vllm-hil option (harness/plugin/options.py)")
    value = config.getoption(name) if default is _NOTSET else config.getoption(name, default)
    if isinstance(value, EnvProblem):
        raise pytest.UsageError(f"env {value}")
    return value


def check_settings(config: pytest.Config) -> None:
    """Refuse a run whose settings are bad, before anything else is checked or cleaned: an
    option's variable its type refused (when the command line does not replace it), a set
    ``HIL_*`` variable of no option that its type refuses, a path option that does not
    name what it must (a folder the run can write in...), an option given without the one it
    only means something beside (``check_needs``). A --help or --version run is not refused:
    it reads no setting. (A reports folder another run holds is refused last, by
    reports_hold.hold_reports, once every argument is accepted.)"""
    if config.getoption("help", False) or config.getoption("version", False):
        return
    for opt in OPTIONS:
        value = config.getoption(opt.name, None)
        if isinstance(value, EnvProblem):
            raise pytest.UsageError(f"env {value}")
    from harness.session.build import BadSetting, check_environment  # the session's own check

    try:
        check_environment()
    except BadSetting as e:
        raise pytest.UsageError(str(e)) from None
    for opt in OPTIONS:
        value = config.getoption(opt.name, None)
        if opt.value_type.disk_check is None or not isinstance(value, str) or not value:
            continue
        variable = opt.env if opt.env and os.environ.get(opt.env) == value else None
        try:
            parse(opt.value_type, value, opt.name, variable)
        except SettingError as e:
            raise pytest.UsageError(str(e)) from None
    check_needs(config)


def _variable_that_gave(opt: Option, args: list[str]) -> str | None:
    """The variable that gave ``opt`` its value: its own, when set and the command line
    does not give the option; else None."""
    if not opt.env or not os.environ.get(opt.env, "").strip():
        return None
    return None if on_command_line(opt.name, args) else opt.env


def check_needs(config: pytest.Config) -> None:
    """Refuse an option given without the option it only means something beside
    (option_needs.PYTEST_NEEDS), naming both, and the variable when it gave the value."""
    values: dict[str, Any] = {o.name: config.getoption(o.name, None) for o in OPTIONS}
    values["--alluredir"] = getattr(getattr(config, "option", None), "allure_report_dir", None)
    defaults = {n.option: BY_NAME[n.option].declared_default() for n in PYTEST_NEEDS}
    invocation = getattr(config, "invocation_params", None)
    args = [str(a) for a in getattr(invocation, "args", ())]
    for need in unmet(PYTEST_NEEDS, values, defaults):
        variable = _variable_that_gave(BY_NAME[need.option], args)
        raise pytest.UsageError(refusal(need, values, variable))


def add_cli_option(parser: argparse.ArgumentParser, name: str, flag: str | None = None,
                   default: Any = None, help: str | None = None) -> None:
    """Declare the option ``name`` on a ``hil`` command's parser (as ``flag``, its own name
    there, e.g. ``--reports-dir`` for ``--hil-reports-dir``): the same type, variable and
    checks as pytest's, paths checked for what they name at once (``default``: the command's
    own default instead of pytest's). A bad variable becomes an ``EnvProblem`` default, which
    ``cli_env_problem`` finds after parsing."""
    opt = BY_NAME[name]
    attrs: dict[str, Any] = {"default": env_default(opt, default, True, flag),
                             "help": help or _help(opt)}
    empty = (opt.declared_default() if default is None else default) == ""
    kind = argparse_type(opt, on_disk=True, empty_ok=empty)
    for key, value in (("type", kind), ("action", opt.action), ("metavar", opt.metavar)):
        if value is not None:
            attrs[key] = value
    action = parser.add_argument(flag or name, **attrs)
    # What the command's dependency check needs (option_needs): the value it has when
    # nothing gives it, and the variable that may give it.
    action.hil_declared_default = opt.declared_default() if default is None else default
    action.hil_env = opt.env


def cli_type(kind: str, option: str) -> Callable[[str], Any]:
    """The argparse ``type`` of a ``hil`` command's own typed argument (no pytest option):
    ``kind`` is a name of harness.core.settings.TYPES."""
    return argparse_type(Option(option, help="", kind=kind), on_disk=True) or str


def cli_env_problem(args: argparse.Namespace) -> str | None:
    """The first bad variable a parsed ``hil`` command would use (an argument the command line
    did not give), as a message; None when there is none."""
    problems = [v for v in vars(args).values() if isinstance(v, EnvProblem)]
    return f"env {problems[0]}" if problems else None


def command_values(given: dict[str, Any]) -> Callable[[str], Any]:
    """The typed value of each declared option for a ``hil`` command that builds a session
    (harness.session.build): ``given``'s (its own arguments, by pytest name), else the option's
    variable's, else its declared default. Every option's variable is checked here, as
    pytest's ``check_settings`` checks them: a bad one raises ``BadSetting`` with its message."""
    from harness.session.build import BadSetting

    values = {o.name: given[o.name] if o.name in given else env_default(o, on_disk=True)
              for o in OPTIONS}
    for found in values.values():
        if isinstance(found, EnvProblem):
            raise BadSetting(f"env {found}")
    return values.__getitem__
