"""EngineConfig: the identity of one engine, and the unit of engine reuse.

Two tests whose EngineConfigs are equal share one live engine in a worker;
tests are ordered by ``EngineConfig.key`` so equal configurations run together.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any


class ConfigError(ValueError):
    """A configuration the harness refuses before any engine starts."""


@dataclass(frozen=True)
class WarmupShape:
    """A static-batching shape a Spyre engine is prepared for."""

    prompt_len: int
    new_tokens: int
    batch_size: int


@dataclass(frozen=True)
class EngineConfig:
    """Everything that decides how an engine is built.

    ``faults`` lists fault specs (see ``harness.in_engine.faults``) installed inside the
    engine process before the engine starts, to prove checks can fail; a fault
    makes the configuration distinct, so a faulty engine never serves a clean test.
    """

    target: str
    model: str
    max_model_len: int
    max_num_seqs: int
    mode: str | None = None
    backend: str | None = None
    block_size: int | None = None
    num_blocks_override: int | None = None
    max_num_batched_tokens: int | None = None
    warmup: WarmupShape | None = None
    faults: tuple[str, ...] = ()
    extra_env: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    device: str | None = None  # the leased device (inventory id) the engine runs on
    stack: str = "default"  # the pinned stack (stacks/NAME.toml) whose venv runs the engine
    # Prefix caching on or off against what the target and mode choose (None: theirs); triage
    # turns it over to see whether a failure depends on it.
    prefix_caching: bool | None = None
    # Ranks per engine (vLLM's tensor_parallel_size): each rank a process of its own, holding
    # its share of every layer and its own copy of the runner's state.
    tensor_parallel_size: int = 1

    def __post_init__(self) -> None:
        validate_engine_config(self)

    @property
    def variant_id(self) -> str:
        """The variant this engine runs (``spyre-eager-cb``), whatever the stack."""
        return "-".join(p for p in (self.target, self.backend, self.mode) if p)

    @property
    def label(self) -> str:
        """Short human name: ``spyre-eager-cb``, ``vllm-cpu``; ``STACK:...`` off the default stack."""
        return self.variant_id if self.stack == "default" else f"{self.stack}:{self.variant_id}"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["faults"] = list(self.faults)
        d["extra_env"] = [list(kv) for kv in self.extra_env]
        if d["prefix_caching"] is None:  # the target's choice: keys stay as they were
            del d["prefix_caching"]
        if d["tensor_parallel_size"] == 1:  # one rank: keys stay as they were
            del d["tensor_parallel_size"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EngineConfig:
        """The configuration ``to_dict`` gave (a KeyError, TypeError or ConfigError on
        anything else)."""
        d = dict(d)
        if d.get("warmup") is not None:
            d["warmup"] = WarmupShape(**d["warmup"])
        d["faults"] = tuple(d.get("faults", ()))
        d["extra_env"] = tuple((str(k), str(v)) for k, v in d.get("extra_env", ()))
        return cls(**d)

    @property
    def key(self) -> str:
        """Stable identity: equal keys mean one engine can serve both."""
        blob = json.dumps(self.to_dict(), sort_keys=True)
        return f"{self.label}:{hashlib.sha256(blob.encode()).hexdigest()[:12]}"

    def with_(self, **changes: Any) -> EngineConfig:
        return replace(self, **changes)


# The kinds' own rules (which targets exist, their modes, backends and block rules): the
# registry (``harness.targets``) adds them when it loads, so this value type stays below the kinds.
_KIND_RULES: list[Callable[[EngineConfig], None]] = []


def add_config_rule(rule: Callable[[EngineConfig], None]) -> None:
    """Run ``rule`` on every EngineConfig made from now on (it raises ConfigError to refuse)."""
    _KIND_RULES.append(rule)


def validate_engine_config(cfg: EngineConfig) -> None:
    """Raise ConfigError naming the bad value and the fix; return on a usable config.

    What a kind accepts (modes, backends, block rules) is the kind's own
    (``harness/targets/<kind>/kind.py``), checked through the rules the registry adds."""
    for rule in _KIND_RULES:
        rule(cfg)
    if cfg.tensor_parallel_size < 1:
        raise ConfigError(f"tensor_parallel_size ({cfg.tensor_parallel_size}) must be at least 1")
    if cfg.max_model_len <= 0 or cfg.max_num_seqs <= 0:
        raise ConfigError(
            f"max_model_len ({cfg.max_model_len}) and max_num_seqs ({cfg.max_num_seqs})"
            " must be positive"
        )
