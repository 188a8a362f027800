"""The harness session ``hil explore`` runs its engines in, built the one way every session is
(harness.session.build, as pytest's ``hil`` fixture builds one): its settings checked before
anything is written or started (``check_session``), then opened (``open_search_session``);
and the target variants it can run here, each checked as the ``target_variant`` fixture
checks one (stack, availability, model, a leased device where the inventory has one), with
the reason where it cannot, and the tensor-parallel sizes each runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.engine.host import CALL_TIMEOUT
from harness.lab.inventory import Inventory
from harness.lab.lease_files import LeaseDirError
from harness.lab.leases import LeaseUnavailable
from harness.scenario.catalog import Model
from harness.session.build import (
    check_faults,
    check_stack,
    open_session,
    session_inventory,
    session_options,
)
from harness.session.facade import HilSession, SessionOptions
from harness.targets import kind
from harness.targets.variants import TargetVariant

# Engines live at once: the geometry under search, and the one a finding is simplified from.
LIVE_ENGINES = 2
WORKER = "explore"  # the lease holder's name


@dataclass(frozen=True)
class SessionSettings:
    """What the search's own arguments give its session; every other option of a session
    comes from its ``HIL_*`` variable or its default, as in a pytest run."""

    cache_dir: Path
    reports_dir: Path  # the session's engine logs and statistics (REPORTS_DIR/explore)
    stack: str
    faults: tuple[str, ...] = ()
    inventory: str = ""
    call_timeout: float = CALL_TIMEOUT


@dataclass(frozen=True)
class CheckedSession:
    """A search's session, every setting checked, nothing written or started yet."""

    opts: SessionOptions
    inventory: Inventory
    value: Callable[[str], Any]  # each declared option's typed value (lease folder...)


def check_session(settings: SessionSettings) -> CheckedSession:
    """The search's session settings, checked as pytest checks its own: the stack, the faults
    (none inherited from HIL_FAULTS), every HIL_* variable (of an option or none), the
    inventory (HIL_INVENTORY too). BadSetting names the first bad one; nothing is written."""
    import pytest

    from harness.plugin.engine_setup import check_no_ambient_faults
    from harness.plugin.faults_declared import device_fault_specs
    from harness.plugin.options import command_values
    from harness.session.build import BadSetting

    # A busy device is not searched (the search goes on elsewhere): no wait for a lease.
    value = command_values({
        "--hil-cache-dir": str(settings.cache_dir), "--hil-reports-dir": str(settings.reports_dir),
        "--stack": settings.stack, "--inject-fault": list(settings.faults),
        "--inventory": settings.inventory, "--engine-timeout": settings.call_timeout,
        "--lease-wait": 0.0})
    opts = session_options(value, max_live_engines=LIVE_ENGINES, triage=False,
                           teacher_forcing=False)
    check_stack(settings.stack)
    try:
        check_no_ambient_faults()
    except pytest.UsageError as e:  # the plugin's refusal: the same message
        raise BadSetting(str(e)) from None
    allow_external = bool(value("--allow-external-faults"))
    check_faults(settings.faults, allow_external)
    inventory = session_inventory(settings.inventory, allow_external)
    # The inventory's device faults, named with the search's own (as a pytest run names them).
    device_faults = tuple(f"{spec} (device {d.id})" for d in inventory.devices
                          for spec in device_fault_specs(d))
    opts = replace(opts, device_faults=device_faults)
    return CheckedSession(opts, inventory, value)


def open_search_session(checked: CheckedSession) -> HilSession:
    """The checked session, opened: engine reuse on, triage off (a finding is shrunk, not
    triaged), the faults given, the inventory's devices leasable."""
    return open_session(checked.opts, checked.inventory, checked.value, WORKER)


def usable_variant(hil: HilSession, variant: TargetVariant, model: Model
                   ) -> tuple[TargetVariant | None, str]:
    """``variant`` ready to run here (bound to a leased device where the inventory has one
    that serves it), or None and why it cannot run."""
    stack = hil.opts.stack
    target = kind(variant.target)
    why = (hil.stack_problem(variant) or target.stack_feature_problem(variant, stack)
           or target.stack_probe(variant, stack) or target.model_probe(model.path))
    if why:
        return None, why
    leases = hil.leases
    if leases is None or not leases.leased_devices(variant.target, variant.backend, variant.mode):
        why = target.availability_probe(variant)
        if why is None and target.needs_device(variant):
            why = (f"{variant.id} runs only on a leased device that serves it, and the inventory"
                   " lists none")
        return (None, why) if why else (variant, "")
    why = target.device_stack_problem(variant, stack)
    if why:
        return None, why
    try:
        lease = leases.lease(variant.target, variant.backend, variant.mode)
    except (LeaseUnavailable, LeaseDirError) as e:
        return None, str(e)
    if lease is None:
        return variant, ""
    broken = leases.broken(lease.device)
    if broken:
        return None, broken
    env = {**target.device_env(lease.device, hil.opts.cache_dir), **lease.env()}
    return variant.on_device(lease.device.id, env), ""


def tensor_parallel_sizes(variant: TargetVariant, sizes: tuple[int, ...], stack: str
                          ) -> tuple[tuple[int, ...], list[str]]:
    """The sizes of ``sizes`` (``--tensor-parallel``) an engine of ``variant`` runs here, and
    for each other one why not (``TP N: why``). A variant bound to a leased device runs one
    rank: the search leases one device per engine."""
    runs: list[int] = []
    why: list[str] = []
    for n in sizes:
        problem = None if n == 1 else kind(variant.target).tensor_parallel_problem(
            variant, n, stack)
        if problem is None and n > 1 and variant.device:
            problem = (f"the search holds the one device {variant.device} it leased; a group of"
                       " devices per engine is leased by the suites (--geometry with a"
                       " tensor_parallel_size)")
        if problem:
            why.append(f"TP {n}: {problem}")
        else:
            runs.append(n)
    return tuple(runs), why
