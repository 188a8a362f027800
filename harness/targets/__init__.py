"""The kind registry: every package here whose ``kind`` module sets ``KIND`` is a target kind,
and so is every kind an installed distribution declares in the entry-point group
``vllm_hil.kinds`` (a kind in a package of its own, anywhere).

Adding a device kind means adding one package (see docs/architecture.md, "Adding a device
kind"); nothing else names kinds. The lookups the rest of the harness uses:
``KINDS`` / ``kind(name)``, ``kind_of_label(label)``, ``engine_kinds()``, ``all_variants()``,
``device_kinds()``, ``target_for(cfg)`` and ``nightly_markers(devices)``; what the kinds
declare, merged: ``start_timeouts()``, ``near_tie_tolerances()``, ``late_env_prefixes()``,
``capacity_refusals()``, ``stack_distributions()``, ``ledger_sources()``, ``device_env_vars()``
(each kind's ``variables`` are registered with the settings layer when the registry loads);
``selftest_modules()``, the kinds' ``hil selftest`` cases; and ``load_fault_modules()``,
which imports every kind's fault modules when the registry loads, so that
``harness.in_engine.faults.FAULTS`` names every kind's faults on the harness side (an engine
process imports them by the names its configuration carries: ``harness.engine.start_config``).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil
import re
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from harness.checks import logprobs as checks_logprobs
from harness.checks.logprobs import LogprobPolicy
from harness.core.config import ConfigError, EngineConfig, add_config_rule
from harness.core.devices import InventoryDevice, describe_device_kind
from harness.core.settings import register_variables
from harness.in_engine import faults as in_engine_faults
from harness.targets.base import (
    DeviceKind,
    NearTieTolerance,
    TargetKind,
    TargetVariant,
    VllmTarget,
)

# Where a kind that lives in a package of its own declares itself, as vLLM's platform plugins
# do in ``vllm.platform_plugins``: ``NAME = "package.kind"`` (the module that sets ``KIND``).
ENTRY_POINT_GROUP = "vllm_hil.kinds"


def _entry_point_kinds() -> list[type[TargetKind]]:
    """The kinds the installed distributions declare in ``ENTRY_POINT_GROUP``; an entry point
    that does not load, or names no kind, fails loudly, naming itself."""
    found: list[type[TargetKind]] = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        where = f"kind entry point {ep.name} = {ep.value!r} (group {ENTRY_POINT_GROUP})"
        try:
            loaded = ep.load()
        except Exception as e:
            raise ImportError(f"{where} does not load: {e!r}") from e
        declared = getattr(loaded, "KIND", loaded)  # the kind module, or its class itself
        if not (isinstance(declared, type) and issubclass(declared, TargetKind)):
            raise TypeError(f"{where} names {declared!r}, no TargetKind: name the kind's"
                            " module (which sets KIND) or its class")
        found.append(declared)
    return found


def _load() -> dict[str, type[TargetKind]]:
    found: list[type[TargetKind]] = []
    for info in pkgutil.iter_modules(__path__):
        if not info.ispkg:  # a kind is a package; its ``kind`` module declares it
            continue
        module = importlib.import_module(f"{__name__}.{info.name}.kind")
        declared = getattr(module, "KIND", None)
        if declared is not None:
            found.append(declared)
    by_name: dict[str, type[TargetKind]] = {}
    for k in [*found, *_entry_point_kinds()]:
        if by_name.get(k.name, k) is not k:
            raise ValueError(f"two kinds are named {k.name!r}: {by_name[k.name].__module__} and"
                             f" {k.__module__}; give the new kind a name of its own")
        by_name[k.name] = k
    return {k.name: k for k in sorted(by_name.values(), key=lambda k: (k.order, k.name))}


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


# A marker's meaning and, in parentheses, what carries it: "runs on this machine's CPU (vllm-cpu)".
_MARKER_DOC = re.compile(r"(.*) \((.*)\)")


def _merged_marker_doc(first: str, other: str) -> str:
    """One meaning of a marker two kinds describe: ``WHAT (A)`` and ``WHAT (B, A)`` are
    ``WHAT (A, B)``; different meanings keep the first kind's."""
    a, b = _MARKER_DOC.fullmatch(first), _MARKER_DOC.fullmatch(other)
    if a is None or b is None or a.group(1) != b.group(1):
        return first
    carriers = dict.fromkeys([*a.group(2).split(", "), *b.group(2).split(", ")])
    return f"{a.group(1)} ({', '.join(carriers)})"


def kind_markers() -> dict[str, str]:
    """Every marker a kind's variants carry, with its meaning (registered with pytest); a
    marker several kinds carry says what of each carries it (``cpu``: vllm-cpu, spyre eager)."""
    out: dict[str, str] = {}
    for k in KINDS.values():
        for v in k.variants:
            for m in v.markers:
                if m not in k.markers:
                    raise ValueError(f"kind {k.name}: variant {v.id} carries marker {m!r},"
                                     " which its markers do not describe")
        for m, doc in k.markers.items():
            out[m] = _merged_marker_doc(out[m], doc) if m in out else doc
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


def registry_geometry(entry: str, chosen: Mapping[str, Any]) -> Mapping[str, Any]:
    """The geometry values of a device registry's entry ``entry`` (``from_registry`` in a lab
    geometry): the first engine kind that reads a registry answers (the hook is an engine
    kind's: ``EngineHooks``)."""
    for k in engine_kinds().values():
        shape = k.registry_geometry(entry, chosen)
        if shape is not None:
            return shape
    raise ConfigError("no installed kind reads a device's model registry")


def late_env_prefixes() -> tuple[str, ...]:
    """Every kind's ``late_env_prefixes``, in kind order."""
    return tuple(dict.fromkeys(p for k in KINDS.values() for p in k.late_env_prefixes))


def per_engine_env_prefixes() -> tuple[str, ...]:
    """Every kind's ``per_engine_env_prefixes``, in kind order."""
    return tuple(dict.fromkeys(p for k in KINDS.values() for p in k.per_engine_env_prefixes))


def capacity_refusals() -> tuple[str, ...]:
    """Every kind's ``capacity_refusal`` (its stack's refusal of a too-small pool at engine
    start), in kind order."""
    return tuple(dict.fromkeys(k.capacity_refusal for k in KINDS.values() if k.capacity_refusal))


def stack_distributions() -> tuple[tuple[str, str], ...]:
    """Every kind's ``distributions`` (report label, distribution name), in kind order, each once."""
    return tuple(dict.fromkeys(d for k in KINDS.values() for d in k.distributions))


def runtime_distributions() -> tuple[str, ...]:
    """Every kind's ``runtime_distributions`` (vendor runtimes), in kind order, each once."""
    return tuple(dict.fromkeys(d for k in KINDS.values() for d in k.runtime_distributions))


def ledger_sources() -> dict[str, str]:
    """The ``KvSnapshot.source`` of every kind's own ledgers -> the kind that declares it."""
    return {s: k.name for k in KINDS.values() for s in k.ledger_sources}


def device_env_vars() -> tuple[str, ...]:
    """Every device kind's ``device_env_vars`` (engine variables naming the device an engine
    was given), in kind order, each once."""
    return tuple(dict.fromkeys(v for d in device_kinds().values() for v in d.device_env_vars))


def fault_modules() -> tuple[str, ...]:
    """Every kind's ``fault_modules``, in kind order, each once."""
    return tuple(dict.fromkeys(m for k in KINDS.values() for m in k.fault_modules))


def load_fault_modules() -> None:
    """Import every kind's fault modules: each registers its faults with
    ``harness.in_engine.fault_registry``, and ``FAULTS`` is put in name order (called when the
    registry loads)."""
    in_engine_faults.load_fault_modules(fault_modules())


def selftest_modules() -> dict[str, ModuleType]:
    """Every kind's ``selftest_module``, imported, by kind name in kind order: ``hil selftest``
    reads its cases there (harness/selftest.py)."""
    return {k.name: importlib.import_module(k.selftest_module)
            for k in KINDS.values() if k.selftest_module}


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
for _kind in KINDS.values():
    register_variables(_kind.variables, f"target kind {_kind.name}")
for _device in device_kinds().values():
    describe_device_kind(_device.name, _device.label, _device.leased)
load_fault_modules()
