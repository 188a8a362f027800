"""The harness session ``hil explore`` runs its engines in: a ``HilSession`` built as the pytest
plugin builds one (``harness/plugin/fixtures.py``), outside pytest, and the target variants it
can run here, each checked as the ``target_variant`` fixture checks one (stack, availability,
model, a leased device where the inventory has one), with the reason where it cannot."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from harness.core.devices import device_root
from harness.engine.host import CALL_TIMEOUT
from harness.lab.inventory import Inventory, discover_inventory, load_inventory
from harness.lab.lease_files import LeaseDirError, default_lease_dir
from harness.lab.leases import LeaseManager, LeaseUnavailable
from harness.scenario.catalog import Model
from harness.session.facade import HilSession, SessionOptions
from harness.targets import kind
from harness.targets.variants import TargetVariant

# Engines live at once: the geometry under search, and the one a finding is simplified from.
LIVE_ENGINES = 2
WORKER = "explore"  # the lease holder's name


@dataclass(frozen=True)
class SessionSettings:
    cache_dir: Path
    reports_dir: Path  # the session's engine logs and statistics (REPORTS_DIR/explore)
    stack: str
    faults: tuple[str, ...] = ()
    inventory: str = ""
    call_timeout: float = CALL_TIMEOUT


def open_session(settings: SessionSettings) -> HilSession:
    """A session with engine reuse on, triage off (a finding is shrunk, not triaged), the
    faults given, the inventory's devices leasable."""
    settings.cache_dir.mkdir(parents=True, exist_ok=True)
    # Engines inherit these; keep vLLM's and inductor's caches inside the project cache.
    os.environ.setdefault("VLLM_CACHE_ROOT", str(settings.cache_dir / "vllm"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(settings.cache_dir / "inductor"))
    opts = SessionOptions(cache_dir=settings.cache_dir, reports_dir=settings.reports_dir,
                          max_live_engines=LIVE_ENGINES, call_timeout=settings.call_timeout,
                          faults=settings.faults, stack=settings.stack, triage=False,
                          teacher_forcing=False)
    leases = LeaseManager(_inventory(settings.inventory), lease_dir=default_lease_dir(),
                          run_dir=settings.reports_dir / "devices", worker=WORKER)
    return HilSession(opts, leases=leases)


def _inventory(path: str) -> Inventory:
    root = device_root()
    return load_inventory(Path(path), root) if path else discover_inventory(root)


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
