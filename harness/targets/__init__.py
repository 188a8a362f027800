"""The kind registry: every package here whose ``kind`` module sets ``KIND`` is a target kind.

Adding a device kind means adding one package (see docs/architecture.md, "Adding a device
kind"); nothing else names kinds. The lookups the rest of the harness uses:
``KINDS`` / ``kind(name)``, ``kind_of_label(label)``, ``engine_kinds()``, ``all_variants()``,
``device_kinds()``, ``target_for(cfg)`` and ``nightly_markers(devices)``; what the kinds
declare, merged: ``start_timeouts()``, ``near_tie_tolerances()``; and ``load_fault_modules()``,
which imports the kinds' fault modules inside the engine process.
"""

from __future__ import annotations

import importlib
import pkgutil

from harness.checks import logprobs as checks_logprobs
from harness.checks.logprobs import LogprobPolicy
from harness.core.config import ConfigError, EngineConfig, add_config_rule
from harness.core.devices import InventoryDevice, describe_device_kind
from harness.targets.base import (
    DeviceKind,
    NearTieTolerance,
    TargetKind,
    TargetVariant,
    VllmTarget,
)


def _load() -> dict[str, type[TargetKind]]:
    found: list[type[TargetKind]] = []
    for info in pkgutil.iter_modules(__path__):
        if not info.ispkg:  # a kind is a package; its ``kind`` module declares it
            continue
        module = importlib.import_module(f"{__name__}.{info.name}.kind")
        declared = getattr(module, "KIND", None)
        if declared is not None:
            found.append(declared)
    return {k.name: k for k in sorted(found, key=lambda k: (k.order, k.name))}


KINDS: dict[str, type[TargetKind]] = _load()


def kind(name: str) -> type[TargetKind]:
    """The kind called ``name``; ConfigError listing the known ones otherwise."""
    try:
        return KINDS[name]
    except KeyError:
        raise ConfigError(
            f"unknown target {name!r}; known targets: {', '.join(engine_kinds())}"
            " (use --target to choose among them)"
        ) from None


def kind_of_label(label: str) -> type[TargetKind]:
    """The kind of an engine or trace label (``spyre-eager-cb``, ``legacy-spyre-0.4:vllm-cpu``);
    for a label of no kind, ``TargetKind`` itself (the neutral defaults)."""
    variant = label.rpartition(":")[2]
    for k in sorted(KINDS.values(), key=lambda k: -len(k.name)):
        if variant == k.name or variant.startswith(f"{k.name}-"):
            return k
    return TargetKind


def engine_kinds() -> dict[str, type[VllmTarget]]:
    """The kinds that run engines (every kind but the reference)."""
    return {n: k for n, k in KINDS.items() if issubclass(k, VllmTarget)}


def all_variants() -> dict[str, TargetVariant]:
    """Every variant of every kind, in kind order: the ``--target`` choices and test ids."""
    return {v.id: v for k in KINDS.values() for v in k.variants}


def all_modes() -> tuple[str, ...]:
    return tuple(dict.fromkeys(m for k in KINDS.values() for m in k.modes))


def kind_markers() -> dict[str, str]:
    """Every marker a kind's variants carry, with its meaning (registered with pytest)."""
    out: dict[str, str] = {}
    for k in KINDS.values():
        for v in k.variants:
            for m in v.markers:
                if m not in k.markers:
                    raise ValueError(f"kind {k.name}: variant {v.id} carries marker {m!r},"
                                     " which its markers do not describe")
        for m, doc in k.markers.items():
            out.setdefault(m, doc)
    return out


def device_kinds() -> dict[str, DeviceKind]:
    """The inventory's device kinds (cpu, spyre, neuron), from the kinds that run on them."""
    return {k.device.name: k.device for k in KINDS.values()}


def device_kind(name: str) -> DeviceKind | None:
    return device_kinds().get(name)


def kinds_on(device_kind_name: str) -> list[type[TargetKind]]:
    """The kinds whose engines run on devices of this inventory kind."""
    return [k for k in KINDS.values() if k.device.name == device_kind_name]


def target_for(cfg: EngineConfig) -> VllmTarget:
    """The kind that builds and runs engines of this configuration, bound to it."""
    return engine_kinds()[cfg.target](cfg)  # a valid EngineConfig names an engine kind


def nightly_markers(devices: list[InventoryDevice]) -> list[str]:
    """The platform markers a nightly selects on a host with ``devices``: always ``cpu``,
    plus the marker of every variant one of the devices serves (a Spyre card: ``spyre``;
    an eager stand-in serves only ``cpu`` variants)."""
    wanted = ["cpu"]
    for v in all_variants().values():
        k = KINDS[v.target]
        if v.platform_marker not in wanted and any(k.serves(d, v.backend, v.mode) for d in devices):
            wanted.append(v.platform_marker)
    return wanted


def start_timeouts() -> dict[str, float]:
    """The kinds' engine-start limits longer than the default, by backend or kind, in kind order."""
    return {what: t for k in KINDS.values() for what, t in k.start_timeouts.items()}


def near_tie_tolerances() -> list[NearTieTolerance]:
    """The backends with a wider near-tie tolerance (one ``--near-tie-tol-BACKEND`` option each)."""
    return [t for k in KINDS.values() for t in k.near_tie_tolerances]


def logprob_policy(label: str, tol_fp32: float | None = None,
                   tol_card: float | None = None) -> LogprobPolicy:
    """The logprob-closeness policy for a trace labelled ``label``: its kind says which backend
    it names and whether that computes in a lower precision than the fp32 reference."""
    k = kind_of_label(label)
    return checks_logprobs.logprob_policy(k.backend_of(label), k.reduced_precision(label),
                                          tol_fp32, tol_card)


def late_env_prefixes() -> tuple[str, ...]:
    """Every kind's ``late_env_prefixes``, in kind order."""
    return tuple(dict.fromkeys(p for k in KINDS.values() for p in k.late_env_prefixes))


def load_probe_modules() -> None:
    """Import the modules the kinds declare in ``probe_modules``: each registers readers of its
    plugin's own KV ledgers with ``harness.in_engine.probes`` (called in the engine process)."""
    for k in KINDS.values():
        for name in k.probe_modules:
            importlib.import_module(name)


def load_fault_modules() -> None:
    """Import the modules the kinds declare in ``fault_modules``: each registers its faults with
    ``harness.in_engine.fault_registry`` (called by ``harness.in_engine.faults``)."""
    for k in KINDS.values():
        for name in k.fault_modules:
            importlib.import_module(name)


def _kind_rules(cfg: EngineConfig) -> None:
    """The registry's part of validating an EngineConfig: a known engine kind, then its own rules."""
    target = kind(cfg.target)
    if cfg.target not in engine_kinds():
        raise ConfigError(
            f"{cfg.target!r} runs no engine; engine targets: {', '.join(engine_kinds())}"
        )
    if cfg.max_model_len > 0 and cfg.max_num_seqs > 0:
        target.validate(cfg)


add_config_rule(_kind_rules)
for _device in device_kinds().values():
    describe_device_kind(_device.name, _device.label, _device.leased)
