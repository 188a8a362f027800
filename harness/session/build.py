"""One way to build a harness session, for every caller: pytest (the ``hil`` fixture,
harness/plugin/fixtures.py), ``hil explore`` and ``hil nightly --explore``
(harness/explore/session.py).

A caller gives the typed value of each declared option (harness/plugin/options.py: pytest's
``option_value``; a ``hil`` command's ``command_values``: its own arguments, else the options'
``HIL_*`` variables, else their defaults), and this module checks the rest once, the same way
for all of them: the ``HIL_*`` variables of no option (``check_environment``), the stack
(``check_stack``), the faults (``check_faults``), the inventory (``session_inventory``); then
turns the values into ``SessionOptions`` (``session_options``) and the session with its
leases (``open_session``).

A bad value raises ``BadSetting``: one line naming the option or variable, the value and what
to do, the message pytest gives (pytest refuses it with exit 4, a ``hil`` command with exit 2).
Nothing here writes before ``open_session``: a refused run leaves every earlier output alone.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.core.comparison import NearTiePolicy
from harness.core.devices import device_root
from harness.core.settings import BY_VARIABLE, env_problems
from harness.lab.inventory import Inventory, discover_inventory, load_inventory
from harness.lab.leases import LeaseManager
from harness.session.facade import HilSession
from harness.session.options import SessionOptions
from harness.targets import near_tie_tolerances

# The typed value of a declared option, by its pytest name (``--hil-cache-dir``...).
OptionValue = Callable[[str], Any]


class BadSetting(ValueError):
    """A setting a session cannot run with; ``str()`` is the whole one-line message."""


def check_environment(environ: dict[str, str] | None = None) -> None:
    """Refuse the first set, user-facing ``HIL_*`` variable of no option whose value its type
    refuses (``HIL_ENGINE_START=zygote``...): engines read them, and would fail each start.
    An option's variable is checked where the option's value is read (``OptionValue``)."""
    others = tuple(n for n, v in BY_VARIABLE.items() if v.option is None)
    for problem in env_problems(environ, names=others):
        raise BadSetting(f"env {problem}; fix or unset it")


def check_stack(name: str) -> str:
    """``name`` when it is a stack a run can use: the host, or a stack file whose venv is
    installed as pinned (a run on a missing stack would skip every test: green for nothing)."""
    from harness.stacks.host import HOST, is_unpinned
    from harness.stacks.spec import StackError, load_stack, stack_python

    if name == HOST:
        return name
    try:
        load_stack(name)
    except StackError as e:
        raise BadSetting(f"--stack: {e}") from None
    if not is_unpinned(name) and stack_python(name) is None:
        raise BadSetting(f"--stack {name}: not installed, or its pins changed since it was"
                         f" installed: run ./setup.sh --stack {name}")
    return name


def check_faults(specs: Collection[str], allow_external: bool = False) -> tuple[str, ...]:
    """``specs`` when each would install as written (``check_fault_spec``: a known fault, its
    keys, a real variant and stack), else the first one's problem."""
    from harness.in_engine.faults import check_fault_spec
    from harness.stacks.host import HOST
    from harness.stacks.spec import list_stacks
    from harness.targets import all_variants

    variants, stacks = list(all_variants()), [*list_stacks(), HOST]
    for spec in specs:
        try:
            check_fault_spec(spec, variants, stacks, allow_external=allow_external)
        except (ValueError, ImportError, AttributeError) as e:
            raise BadSetting(f"--inject-fault: {e}") from None
    return tuple(specs)


def session_inventory(path: str, allow_external_faults: bool = False) -> Inventory:
    """The devices a session leases: the inventory file ``path`` (below the device root), or
    discovery's without one. A file that is missing or wrong raises BadSetting with the
    inventory's own message (the file, the entry, the field)."""
    root = device_root()
    try:
        if not path:
            return discover_inventory(root)
        return load_inventory(Path(path), root, allow_external_faults=allow_external_faults)
    except ValueError as e:  # InventoryError among them
        raise BadSetting(str(e)) from None


def session_options(value: OptionValue, device_faults: tuple[str, ...] = (),
                    **overrides: Any) -> SessionOptions:
    """The checked options of a session: every ``HIL_*`` variable of no option first, then
    each option's typed value (``value``), the folders made absolute (engines and their fork
    server run from folders of their own); ``overrides`` replace what a caller decides itself
    (``hil explore``: its engines at once, no triage). Nothing is created."""
    check_environment()
    opts = SessionOptions(
        cache_dir=Path(value("--hil-cache-dir")).absolute(),
        reports_dir=Path(value("--hil-reports-dir")).absolute(),
        near_tie=NearTiePolicy(top_k=value("--near-tie-topk"), prob_tol=value("--near-tie-tol")),
        near_tie_tols={t.backend: value(f"--near-tie-tol-{t.backend}")
                       for t in near_tie_tolerances()},
        engine_reuse=not value("--no-engine-reuse"),
        reference_cache=not value("--no-reference-cache"),
        max_live_engines=value("--max-live-engines"),
        call_timeout=value("--engine-timeout"),
        start_timeout=value("--engine-start-timeout"),
        faults=tuple(value("--inject-fault")),
        device_faults=device_faults,
        kv_probe=not value("--no-kv-probe"),
        stack=value("--stack"),
        plan_only=value("--hil-plan"),
        engine_replace=not value("--no-engine-replace"),
        logprob_tol=value("--logprob-tol"),
        logprob_tol_card=value("--logprob-tol-card"),
        teacher_forcing=not value("--no-teacher-forcing"),
        triage=not value("--no-triage"),
        triage_max=value("--triage-max"),
        triage_budget=value("--triage-budget"),
    )
    return replace(opts, **overrides)


def prepare_cache(cache_dir: Path) -> None:
    """Make the cache folder; engines inherit vLLM's and inductor's cache folders inside it."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("VLLM_CACHE_ROOT", str(cache_dir / "vllm"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir / "inductor"))


def open_session(opts: SessionOptions, inventory: Inventory, value: OptionValue,
                 worker: str) -> HilSession:
    """The session of ``opts``, its devices leased from ``inventory`` as ``worker`` (the lease
    folder, wait and sharing: ``value``'s), its cache prepared."""
    prepare_cache(opts.cache_dir)
    leases = LeaseManager(inventory, lease_dir=Path(value("--lease-dir")),
                          run_dir=opts.reports_dir / "devices", worker=worker,
                          wait_seconds=value("--lease-wait"), share=value("--lease-share"))
    return HilSession(opts, leases=leases)
