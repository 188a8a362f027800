"""The contract of a target kind, checked of every registered kind (``harness.targets.KINDS``,
a kind declared by an entry point included): it declares everything the harness asks of it,
and what it declares is consistent (docs/architecture.md, "Adding a device kind")."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest

from harness import targets
from harness.core.config import ConfigError, EngineConfig
from harness.targets.base import OFFLINE_ENV, REQUIRED, DeviceKind, TargetKind, VllmTarget
from harness.targets.declarations import CAPABILITIES

KINDS = list(targets.KINDS.values())
LIMITS = SimpleNamespace(max_model_len=256, max_num_seqs=2, sb_warmup=(64, 20, 2), cp_chunk=128)


@pytest.fixture(params=KINDS, ids=[k.name for k in KINDS])
def kind(request: pytest.FixtureRequest) -> type[TargetKind]:
    return request.param


def runs_engines(kind: type[TargetKind]) -> bool:
    return issubclass(kind, VllmTarget)


def test_it_declares_what_every_kind_must(kind: type[TargetKind]) -> None:
    """``REQUIRED``: a name, its device, its variants and their markers (a kind that runs no
    engine, the reference, has no variants: every variant is compared against it)."""
    for attr in REQUIRED:
        value = getattr(kind, attr)
        if attr in ("variants", "markers") and not runs_engines(kind):
            assert not value, f"{kind.name} runs no engine, but declares {attr}"
            continue
        assert value, f"{kind.name or kind.__name__} declares no {attr}"
    assert targets.KINDS[kind.name] is kind
    assert isinstance(kind.device, DeviceKind)
    assert targets.device_kinds()[kind.device.name] == kind.device
    assert isinstance(kind.order, int)


def test_its_variants_are_its_own_and_named_under_it(kind: type[TargetKind]) -> None:
    """A variant's id names its kind (``kind_of_label`` finds the kind from a trace's label)
    and no other kind's variant has it."""
    for v in kind.variants:
        assert v.target == kind.name, v
        assert v.id == kind.name or v.id.startswith(f"{kind.name}-"), v
        assert targets.kind_of_label(v.id) is kind, v
        assert targets.kind_of_label(f"default:{v.id}") is kind, v
        assert targets.all_variants()[v.id] is v, f"another kind's variant is also {v.id!r}"


def test_every_marker_is_described_and_carried(kind: type[TargetKind]) -> None:
    """Markers are strict: each one a variant carries is described; a description no variant
    carries is dead; the first marker (the platform's, what ``-m`` selects) is the CPU's or the
    kind's device's."""
    carried = {m for v in kind.variants for m in v.markers}
    assert carried <= set(kind.markers), carried - set(kind.markers)
    assert set(kind.markers) <= carried, set(kind.markers) - carried
    for v in kind.variants:
        assert v.platform_marker in ("cpu", kind.device.name), v
        assert len(set(v.markers)) == len(v.markers), v


def test_capabilities_come_from_the_vocabulary(kind: type[TargetKind]) -> None:
    for v in kind.variants:
        assert set(v.capabilities) <= set(CAPABILITIES), set(v.capabilities) - set(CAPABILITIES)
        assert len(set(v.capabilities)) == len(v.capabilities), v
        if v.switches_off is not None:  # a control: of a capability, which it then has not
            assert v.switches_off in CAPABILITIES and not v.has(v.switches_off), v
            assert v.opt_in


def test_its_capabilities_are_backed_by_its_hooks(kind: type[TargetKind]) -> None:
    """What a suite that asks for a capability then asks of the kind is there."""
    have = {c for v in kind.variants for c in (*v.capabilities, v.switches_off) if c}
    if "refuses_small_pool" in have:
        assert kind.refuses_small_pool and kind.capacity_refusal
    if "join_reservation" in have:
        block = kind.geometry().block_size or LIMITS.max_model_len
        assert kind.join_reservation(64, 64, 128, block) is not None
    if "harness_sized_pool" in have:
        assert kind.full_batch_pool(LIMITS.max_model_len, LIMITS.max_num_seqs), (
            "the harness sizes this kind's pool, but full_batch_pool gives no size")
    if "forced_preemption" in have:
        assert kind.fault_modules, "a forced preemption needs the kind's part of the fault"
    for v in kind.variants:  # a stack may lack a capability; it never invents one
        for c in CAPABILITIES:
            if not v.has(c) and c != v.switches_off:
                continue
            why = kind.capability_problem(v, c, "default")
            assert why is None or (isinstance(why, str) and why), (v, c, why)


def test_modes_and_backends_are_declared_and_used(kind: type[TargetKind]) -> None:
    for v in kind.variants:
        if kind.modes:
            assert v.mode in kind.modes and v.backend in kind.backends, v
        else:
            assert v.mode is None and v.backend in (None, *kind.backends), v
    used_modes = {v.mode for v in kind.variants}
    assert set(kind.modes) <= used_modes, set(kind.modes) - used_modes
    if kind.device.backends:
        assert set(kind.device.backends) == set(kind.backends)
    named = {*kind.backends, kind.name}
    assert set(kind.backend_precisions) <= set(kind.backends)
    assert set(kind.start_timeouts) <= named
    assert {t.backend for t in kind.near_tie_tolerances} <= set(kind.backends)


def test_its_engines_get_the_harness_environment_and_arguments(kind: type[TargetKind]) -> None:
    """Every engine of the kind runs offline, and is built from its configuration: the first
    variant whose configuration the default stack takes."""
    if not runs_engines(kind):
        with pytest.raises(ConfigError, match="runs no engine"):
            EngineConfig(target=kind.name, model="m", max_model_len=256, max_num_seqs=2)
        return
    configs = []
    for v in kind.variants:
        try:
            configs.append(v.engine_config("m", LIMITS))
        except ConfigError:
            continue  # a mode the default stack does not have
    assert configs, f"no variant of {kind.name} is a valid engine configuration"
    engine = targets.target_for(configs[0])
    assert isinstance(engine, kind)
    env = engine.engine_env()
    assert {k: env[k] for k in OFFLINE_ENV} == OFFLINE_ENV
    assert engine.llm_kwargs()["model"] == "m"


def test_the_modules_it_names_import(kind: type[TargetKind]) -> None:
    """Its fault, probe and selftest modules, and its runner hooks, are importable by name
    (the engine process and ``hil selftest`` import them so)."""
    for name in (*kind.fault_modules, *kind.probe_modules):
        importlib.import_module(name)
    for ref in getattr(kind, "runner_hooks", {}).values():
        module, _, attr = ref.partition(":")
        assert callable(getattr(importlib.import_module(module), attr)), ref
    if kind.selftest_module:
        module = importlib.import_module(kind.selftest_module)
        declared = [*getattr(module, "CASES", ()), *getattr(module, "DEVICE_CASES", ())]
        assert declared or getattr(module, "DEVICE_ONLY_FAULTS", ()), kind.selftest_module
        assert {c.target for c in declared} <= {v.id for v in kind.variants}
