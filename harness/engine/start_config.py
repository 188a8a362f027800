"""What an engine process and a fork-server parent are started with from the kinds, by name.

The engine process imports nothing from the kind registry: the harness side asks the registry
here and hands over names (``harness.in_engine.kind_modules``). An engine's configuration
carries every kind's fault modules (a fault spec may name another kind's fault, installed only
in its variant's engines), its own kind's probe modules, the reference of its kind's
``engine_info`` and its kind's runner hooks; a fork-server parent's environment carries every
kind's plugin preload map and every module an engine imports by those names (the parent
imports them once, before it forks an engine).
"""

from __future__ import annotations

from typing import Any

from harness.core.config import EngineConfig
from harness.in_engine.kind_modules import (
    FORK_PARENT_ENV,
    KIND_MODULES,
    ForkParentModules,
    KindModules,
)
from harness.targets import KINDS, engine_kinds, fault_modules, kind
from harness.targets.base import TargetKind


def engine_info_ref(k: type[TargetKind]) -> str:
    """The reference (``module:Class.engine_info``) the engine process calls for ``k``'s facts."""
    return f"{k.__module__}:{k.__qualname__}.engine_info"


def kind_modules(target: str) -> KindModules:
    """The names an engine of the kind ``target`` imports from the kinds."""
    k = kind(target)
    return KindModules(
        fault_modules=fault_modules(),
        probe_modules=tuple(k.probe_modules),
        engine_info=engine_info_ref(k),
        runner_hooks=dict(k.runner_hooks),
        rank_env_prefixes=((*k.device.group_env_prefixes, "RANK")
                           if k.device.group_env_prefixes else ()),
    )


def engine_config(cfg: EngineConfig) -> dict[str, Any]:
    """The configuration dict the engine process is started with: ``cfg`` and, under
    ``KIND_MODULES``, what it imports from the kinds."""
    return {**cfg.to_dict(), KIND_MODULES: kind_modules(cfg.target).to_dict()}


def plugin_preload() -> dict[str, tuple[str, ...]]:
    """Every kind's ``plugin_preload`` (platform module prefix -> modules), in kind order."""
    return {prefix: tuple(modules) for k in KINDS.values()
            for prefix, modules in k.plugin_preload.items()}


def fork_parent_modules() -> ForkParentModules:
    """What a fork-server parent takes from the kinds: every kind's plugin preload map and every
    module an engine of any kind imports by name."""
    names = (m for target in engine_kinds() for m in kind_modules(target).module_names())
    return ForkParentModules(plugin_preload(), tuple(dict.fromkeys(names)))


def fork_parent_env() -> dict[str, str]:
    """What a fork-server parent's environment carries from the kinds."""
    return {FORK_PARENT_ENV: fork_parent_modules().to_env()}
