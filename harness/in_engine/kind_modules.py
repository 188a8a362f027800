"""What the engine process takes from the target kinds: names, imported here.

The harness side (``harness.engine.start_config``) puts into the engine's configuration, under
``KIND_MODULES``, the names of what the engine process needs from the kinds: the modules that
register faults (every kind's: a fault spec may name another kind's fault, installed only in
its variant's engines), the modules that register readers of the engine's kind's own KV ledgers,
the function that gives the kind's facts after start (``engine_info``) and the runner hooks
through which a kind-free fault reaches the kind's plugin runner. The fork-server parent gets,
in its environment (``FORK_PARENT_ENV``), every kind's plugin preload map and the modules its
engines will import by name, so that it imports them once for all of them. Nothing under
``harness/in_engine`` imports a kind's package: what it needs arrives here by name.
"""

from __future__ import annotations

import importlib
import inspect
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# The key of the engine configuration dict that carries a ``KindModules``.
KIND_MODULES = "kind_modules"
# The fork-server parent's variable holding a ``ForkParentModules`` (JSON).
FORK_PARENT_ENV = "HIL_FORKSERVER_KIND_MODULES"

# Runner hooks a kind may declare (``runner_hooks``: name -> "module:function").
# BATCH_ORDER: fn(publish) -> bool. Where the kind's plugin runner runs this engine, patch it to
# call ``publish(request ids by batch row, or None)`` before it samples, and return True; return
# False elsewhere (the row corruption of harness.in_engine.faults.conditions).
BATCH_ORDER = "batch-order"


@dataclass(frozen=True)
class KindModules:
    """The names the engine process imports from the kinds, as its configuration carries them."""

    fault_modules: tuple[str, ...] = ()
    probe_modules: tuple[str, ...] = ()
    engine_info: str | None = None  # "module:attribute.path", called with no arguments
    runner_hooks: Mapping[str, str] = field(default_factory=dict)  # hook -> "module:function"
    # Variables (prefixes) each tensor-parallel rank reports from its own process (the device
    # it opens: harness.in_engine.ranks).
    rank_env_prefixes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The plain form sent in the engine's configuration."""
        return {"fault_modules": list(self.fault_modules),
                "probe_modules": list(self.probe_modules),
                "engine_info": self.engine_info,
                "runner_hooks": dict(self.runner_hooks),
                "rank_env_prefixes": list(self.rank_env_prefixes)}

    def module_names(self) -> tuple[str, ...]:
        """Every module these names import, each once."""
        refs = [r for r in (self.engine_info, *self.runner_hooks.values()) if r]
        return tuple(dict.fromkeys([*self.fault_modules, *self.probe_modules,
                                    *(r.partition(":")[0] for r in refs)]))

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> KindModules:
        """What an engine configuration dict carries under ``KIND_MODULES`` (nothing when it
        carries none: a configuration built without the harness side)."""
        d = config.get(KIND_MODULES) or {}
        return cls(fault_modules=tuple(d.get("fault_modules") or ()),
                   probe_modules=tuple(d.get("probe_modules") or ()),
                   engine_info=d.get("engine_info") or None,
                   runner_hooks=dict(d.get("runner_hooks") or {}),
                   rank_env_prefixes=tuple(d.get("rank_env_prefixes") or ()))


def import_modules(names: Iterable[str]) -> None:
    """Import each named module (which registers what it declares where it is imported)."""
    for name in names:
        importlib.import_module(name)


def resolve(ref: str) -> Any:
    """The object a ``"package.module:attribute.path"`` reference names."""
    module_name, colon, path = ref.partition(":")
    if not colon or not module_name or not path:
        raise ValueError(f"{ref!r} is not a reference of the form package.module:attribute")
    obj: Any = importlib.import_module(module_name)
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def engine_info(config: Mapping[str, Any], vllm_config: Any = None) -> dict[str, Any]:
    """The kind's own facts about this engine, from the function its configuration names
    (none where it names none); a function that takes an argument gets the engine's vLLM
    configuration."""
    ref = KindModules.from_config(config).engine_info
    if not ref:
        return {}
    fn = resolve(ref)
    takes_config = bool(inspect.signature(fn).parameters)
    return dict(fn(vllm_config) if takes_config else fn())


def runner_hook(config: Mapping[str, Any], name: str) -> Callable[..., Any] | None:
    """The kind's runner hook ``name`` named in the engine configuration, or None."""
    ref = KindModules.from_config(config).runner_hooks.get(name)
    return resolve(ref) if ref else None


@dataclass(frozen=True)
class ForkParentModules:
    """What a fork-server parent takes from the kinds: every kind's plugin preload map (the
    module prefix of a platform's class -> what an engine start on it pulls in) and the modules
    its engines import by name (``KindModules.module_names`` of every kind)."""

    plugin_preload: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    modules: tuple[str, ...] = ()

    def to_env(self) -> str:
        """The value of ``FORK_PARENT_ENV`` that carries these."""
        return json.dumps({"plugin_preload": {p: list(m) for p, m in self.plugin_preload.items()},
                           "modules": list(self.modules)})

    @classmethod
    def from_env(cls, value: str) -> ForkParentModules:
        """What a ``FORK_PARENT_ENV`` value carries (nothing for an empty one)."""
        if not value.strip():
            return cls()
        d = json.loads(value)
        return cls(plugin_preload={str(p): tuple(m) for p, m in d["plugin_preload"].items()},
                   modules=tuple(d["modules"]))
