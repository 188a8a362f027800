"""What the harness side hands the engine process and the fork-server parent from the kinds
(harness/engine/start_config.py): names that resolve there, the engine's kind's own, and every
kind's faults."""

from __future__ import annotations

from harness.core.config import EngineConfig
from harness.engine.start_config import (
    engine_config,
    fork_parent_env,
    fork_parent_modules,
    kind_modules,
)
from harness.in_engine.faults import FAULTS
from harness.in_engine.kind_modules import (
    BATCH_ORDER,
    FORK_PARENT_ENV,
    KIND_MODULES,
    ForkParentModules,
    KindModules,
    resolve,
)
from harness.targets import KINDS, engine_kinds, fault_modules, kind
from harness.targets.spyre.batch_order import publish_batch_order


def _config(target: str, **kw: str) -> EngineConfig:
    return EngineConfig(target=target, model="/m", max_model_len=256, max_num_seqs=2, **kw)


def test_an_engines_configuration_names_its_kinds_modules_and_every_kinds_faults():
    spyre = _config("spyre", backend="eager", mode="cp", max_num_batched_tokens=128)
    sent = engine_config(spyre)
    assert {k: v for k, v in sent.items() if k != KIND_MODULES} == spyre.to_dict()
    names = KindModules.from_config(sent)
    assert names.fault_modules == fault_modules() and names.fault_modules
    assert names.probe_modules == kind("spyre").probe_modules
    assert resolve(str(names.engine_info)) == kind("spyre").engine_info
    assert resolve(names.runner_hooks[BATCH_ORDER]) is publish_batch_order

    cpu = KindModules.from_config(engine_config(_config("vllm-cpu")))
    # A vllm-cpu engine still knows every kind's faults: a spec may name one for another variant.
    assert cpu.fault_modules == names.fault_modules
    assert cpu.probe_modules == () and cpu.runner_hooks == {}
    assert resolve(str(cpu.engine_info))() == {}


def test_the_harness_side_sees_every_kinds_faults():
    # hil selftest and option validation read FAULTS: the registry loaded every kind's.
    declared = {m for k in KINDS.values() for m in k.fault_modules}
    assert declared <= {f.__module__ for f in FAULTS.values()}
    assert list(FAULTS) == sorted(FAULTS)


def test_a_fork_parent_gets_every_kinds_preload_map_and_what_engines_import_by_name():
    sent = ForkParentModules.from_env(fork_parent_env()[FORK_PARENT_ENV])
    assert sent == fork_parent_modules()
    for k in KINDS.values():
        for prefix, modules in k.plugin_preload.items():
            assert sent.plugin_preload[prefix] == tuple(modules)
    for target in engine_kinds():
        assert set(kind_modules(target).module_names()) <= set(sent.modules)
