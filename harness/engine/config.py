"""EngineConfig: the identity of one engine, and the unit of engine reuse.

Two tests whose EngineConfigs are equal share one live engine in a worker;
tests are ordered by ``EngineConfig.key`` so equal configurations run together.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

KNOWN_TARGETS = ("vllm-cpu", "spyre", "neuron")
SPYRE_MODES = ("sb", "cb", "cp")
SPYRE_BACKENDS = ("eager", "sendnn")
SPYRE_BLOCK_SIZE = 64  # vllm-spyre's fixed KV block size (platform._block_size)


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

    ``faults`` lists fault specs (see ``harness.engine.faults``) installed inside the
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

    def __post_init__(self) -> None:
        validate_engine_config(self)

    @property
    def label(self) -> str:
        """Short human name: ``spyre-eager-cb``, ``vllm-cpu``."""
        parts = [self.target] if self.stack == "default" else [f"{self.stack}:{self.target}"]
        if self.backend:
            parts.append(self.backend)
        if self.mode:
            parts.append(self.mode)
        return "-".join(parts)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["faults"] = list(self.faults)
        d["extra_env"] = [list(kv) for kv in self.extra_env]
        return d

    @property
    def key(self) -> str:
        """Stable identity: equal keys mean one engine can serve both."""
        blob = json.dumps(self.to_dict(), sort_keys=True)
        return f"{self.label}:{hashlib.sha256(blob.encode()).hexdigest()[:12]}"

    def with_(self, **changes: Any) -> EngineConfig:
        return replace(self, **changes)


def validate_engine_config(cfg: EngineConfig) -> None:
    """Raise ConfigError naming the bad value and the fix; return on a usable config."""
    if cfg.target not in KNOWN_TARGETS:
        raise ConfigError(
            f"unknown target {cfg.target!r}; known targets: {', '.join(KNOWN_TARGETS)}"
            " (use --target to choose among them)"
        )
    if cfg.max_model_len <= 0 or cfg.max_num_seqs <= 0:
        raise ConfigError(
            f"max_model_len ({cfg.max_model_len}) and max_num_seqs ({cfg.max_num_seqs})"
            " must be positive"
        )
    if cfg.target == "spyre":
        if cfg.mode not in SPYRE_MODES:
            raise ConfigError(
                f"unknown spyre mode {cfg.mode!r}; known modes: {', '.join(SPYRE_MODES)}"
                " (sb = static batching, cb = continuous batching, cp = chunked prefill)"
            )
        if cfg.backend not in SPYRE_BACKENDS:
            raise ConfigError(
                f"unknown spyre backend {cfg.backend!r}; known backends:"
                f" {', '.join(SPYRE_BACKENDS)} (eager runs on the CPU, sendnn on a card)"
            )
        if cfg.mode == "sb":
            if cfg.warmup is None:
                raise ConfigError("spyre static batching (sb) needs a warmup shape")
            if cfg.warmup.prompt_len % SPYRE_BLOCK_SIZE:
                raise ConfigError(
                    f"spyre sb warmup prompt length {cfg.warmup.prompt_len} is not a multiple"
                    f" of {SPYRE_BLOCK_SIZE}; vllm-spyre refuses it"
                )
        elif cfg.max_model_len % SPYRE_BLOCK_SIZE:
            raise ConfigError(
                f"spyre {cfg.mode} max_model_len {cfg.max_model_len} is not a multiple of the"
                f" {SPYRE_BLOCK_SIZE}-token KV block"
            )
        if cfg.mode == "cp":
            chunk = cfg.max_num_batched_tokens
            if chunk is None or chunk % SPYRE_BLOCK_SIZE:
                raise ConfigError(
                    f"spyre chunked prefill needs max_num_batched_tokens a multiple of"
                    f" {SPYRE_BLOCK_SIZE}; got {chunk}"
                )
    elif cfg.mode is not None or cfg.backend is not None:
        raise ConfigError(
            f"target {cfg.target!r} takes no mode or backend (got mode={cfg.mode!r},"
            f" backend={cfg.backend!r}); modes and backends are spyre's"
        )
