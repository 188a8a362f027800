"""What every target kind must declare, and what every target answers.

A *kind* (one package under ``harness/targets/``) is the one place that knows a device family.
Its ``kind`` module sets ``KIND`` to a subclass of ``TargetKind`` (the reference) or of
``VllmTarget`` (a kind that runs engines through vLLM). The split:

- **required** (here): ``name``, ``device`` (the ``DeviceKind`` it runs on), ``variants`` and the
  ``markers`` they carry (``REQUIRED``), and its place ``order``; an engine kind's
  ``engine_env()`` and ``llm_kwargs()`` (extended from the defaults here, never replaced) and
  ``check_request``;
- **optional** (``harness/targets/kind_hooks.py``): every other hook, each with a neutral
  default: modes and backends, pool geometry, precision, device environment and verification,
  start limits, the stack report, dummy padding, capacity refusal, fault and probe modules.

The reference and the engine targets answer the same verb with the same input and return the
same ``Trace`` (``harness.targets.runner``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from harness.core.config import ConfigError, EngineConfig
from harness.core.cpu_share import share_env
from harness.targets.declarations import (
    MODEL_DTYPE,
    OFFLINE_ENV,
    PRECISION_OF_DTYPE,
    RANK_EXTENSION,
    NearTieTolerance,
    PoolGeometry,
    TargetVariant,
    device_dtypes,
)
from harness.targets.device_kind import CPU_DEVICE, DeviceKind
from harness.targets.kind_hooks import EngineHooks, KindHooks

__all__ = [
    "CPU_DEVICE", "MODEL_DTYPE", "OFFLINE_ENV", "PRECISION_OF_DTYPE", "REQUIRED", "DeviceKind",
    "EngineHooks", "KindHooks", "NearTieTolerance", "PoolGeometry", "TargetKind",
    "TargetVariant", "VllmTarget", "device_dtypes",
]

# What every kind must declare (an empty value is no declaration).
REQUIRED = ("name", "device", "variants", "markers")


class TargetKind(KindHooks):
    """The declaration of one kind; a module under harness/targets/ sets ``KIND`` to one."""

    name: ClassVar[str] = ""
    order: ClassVar[int] = 100  # position in variant lists and test ids
    device: ClassVar[DeviceKind] = CPU_DEVICE
    variants: ClassVar[tuple[TargetVariant, ...]] = ()
    markers: ClassVar[dict[str, str]] = {}  # the markers its variants carry, with their meaning


class VllmTarget(EngineHooks, TargetKind):
    """A kind served through vLLM; subclasses add their env, arguments and limits."""

    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg

    def engine_env(self) -> dict[str, str]:
        """Environment variables the engine process needs, on top of the inherited one.

        The one source of a kind's engine environment: stack files add only what a
        stack needs differently (``[env]``, ``[targets.env.VARIANT]``). Every engine computes
        with its share of the cores (harness.core.cpu_share) unless the lab set its own."""
        return {**OFFLINE_ENV, **share_env(self.cfg.tensor_parallel_size)}

    def llm_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``vllm.LLM``."""
        cfg = self.cfg
        kw: dict[str, Any] = {
            "model": cfg.model,
            "tokenizer": cfg.model,
            "max_model_len": cfg.max_model_len,
            "max_num_seqs": cfg.max_num_seqs,
            "seed": 0,
            "disable_log_stats": False,
            # Shared prefix blocks would make block ownership ambiguous.
            "enable_prefix_caching": False,
        }
        if cfg.block_size is not None:
            kw["block_size"] = cfg.block_size
        if cfg.num_blocks_override is not None:
            kw["num_gpu_blocks_override"] = cfg.num_blocks_override
        if cfg.max_num_batched_tokens is not None:
            kw["max_num_batched_tokens"] = cfg.max_num_batched_tokens
        if cfg.tensor_parallel_size > 1:  # ranks in processes of their own, each told by name
            kw.update(tensor_parallel_size=cfg.tensor_parallel_size,
                      distributed_executor_backend="mp", worker_extension_cls=RANK_EXTENSION)
        return kw

    def check_request(self, prompt_len: int, max_tokens: int) -> None:
        """Raise ConfigError when the engine would refuse this request."""
        if prompt_len + max_tokens > self.cfg.max_model_len:
            raise ConfigError(
                f"prompt of {prompt_len} tokens + max_tokens {max_tokens} exceeds"
                f" max_model_len {self.cfg.max_model_len} on {self.cfg.label};"
                " shorten the prompt, lower max_tokens or raise max_model_len"
            )
