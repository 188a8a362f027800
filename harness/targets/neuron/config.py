"""What the harness passes to vllm-neuron, and why.

Each value below was read against vllm-neuron 0.2.0 (git tag 0.2.0, a96712544a52; it pins
vLLM 0.11.0) and is checked by running that code in tests/unit/targets/neuron/test_config.py:

- ``num_gpu_blocks_override``: its README requires it (``ceil(max_model_len // block_size) *
  max_num_seqs``); ``NeuronPlatform.check_and_update_config`` adds the null block itself (+1,
  once, guarded by ``_neuron_null_block_adjusted``), so the harness passes ``max_num_seqs``
  full-length blocks, never ``max_num_seqs + 1``.
- ``block_size = max_model_len``: the same hook sets it when prefix caching is off (the harness
  turns prefix caching off); it is passed too, so the harness's own block arithmetic agrees.
- ``tensor_parallel_size`` and ``override_neuron_config`` (in ``additional_config``, where
  ``neuronx_distributed_model_loader.get_neuron_model`` reads it): from the inventory's
  per-device ``engine`` table.
- ``on_device_sampling_config = None`` in ``override_neuron_config``: the loader's default is
  ``OnDeviceSamplingConfig(dynamic=True, ...)``, with which the runner returns sampled ids and
  ``logprobs_tensors=None`` (no logprobs); with None its ``_cpu_sample`` runs vLLM's Sampler on
  the host, which returns logprobs for the near-tie rule.
- ``NEURON_RT_VISIBLE_CORES`` (the platform's ``device_control_env_var``): the lease's cores.
- ``NEURON_COMPILED_ARTIFACTS``: the loader uses this folder as it is (no per-config subfolder),
  else it compiles into the model folder; the harness gives each compiled shape its own folder
  under the harness cache.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core.config import ConfigError, EngineConfig

VLLM_NEURON_REF = "vllm-neuron 0.2.0 (git a96712544a52)"
# Text model architectures vllm-neuron 0.2.0's README lists (Llama 2/3.1/3.3, Qwen 2.5, Qwen 3);
# Llama 4 is multimodal there and not driven by the harness.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "Llama 2/3.1/3.3",
    "Qwen2ForCausalLM": "Qwen 2.5",
    "Qwen3ForCausalLM": "Qwen 3",
}
CORES_ENV = "NEURON_RT_VISIBLE_CORES"
# The inventory's per-device engine table travels to the target in the lease's environment.
DEVICE_ENGINE_ENV = "HIL_NEURON_ENGINE"
ENGINE_KEYS = ("tensor_parallel_size", "override_neuron_config", "dtype")
# The reference computes in float32; a Neuron device may be given bfloat16 by the inventory.
DEFAULT_DTYPE = "float32"
NEURON_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class NeuronEngineSettings:
    """The lab-decided engine settings of one Neuron device (inventory ``engine`` table)."""

    tensor_parallel_size: int = 1
    dtype: str = DEFAULT_DTYPE
    override_neuron_config: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {"tensor_parallel_size": self.tensor_parallel_size, "dtype": self.dtype,
             "override_neuron_config": dict(self.override_neuron_config)},
            sort_keys=True,
        )


def parse_engine_settings(raw: Any, where: str) -> NeuronEngineSettings:
    """Check an inventory ``engine`` table for a Neuron device; ConfigError names the fix."""
    if raw is None:
        return NeuronEngineSettings()
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: engine must be a table, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(ENGINE_KEYS))
    if unknown:
        raise ConfigError(f"{where}: engine has unknown key(s) {unknown}; known: {list(ENGINE_KEYS)}")
    tp = raw.get("tensor_parallel_size", 1)
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise ConfigError(f"{where}: engine.tensor_parallel_size must be a positive integer, got {tp!r}")
    dtype = raw.get("dtype", DEFAULT_DTYPE)
    if dtype not in NEURON_DTYPES:
        raise ConfigError(f"{where}: engine.dtype {dtype!r} is not one of {', '.join(NEURON_DTYPES)}")
    override = raw.get("override_neuron_config", {})
    if not isinstance(override, Mapping):
        raise ConfigError(f"{where}: engine.override_neuron_config must be a table")
    if "on_device_sampling_config" in override:
        raise ConfigError(
            f"{where}: engine.override_neuron_config sets on_device_sampling_config; the harness"
            " samples on the host (on_device_sampling_config = None) so that logprobs come back"
            " for the near-tie rule: remove the key"
        )
    if "pa_num_blocks" in override:
        raise ConfigError(
            f"{where}: engine.override_neuron_config sets pa_num_blocks; the harness passes the"
            " block count as num_gpu_blocks_override (vllm-neuron must see both agree): remove it"
        )
    return NeuronEngineSettings(tensor_parallel_size=tp, dtype=dtype,
                                override_neuron_config=dict(override))


def settings_from_env(env: Mapping[str, str]) -> NeuronEngineSettings:
    """The settings a lease carried (``HIL_NEURON_ENGINE``), or the defaults."""
    raw = env.get(DEVICE_ENGINE_ENV)
    if not raw:
        return NeuronEngineSettings()
    return parse_engine_settings(json.loads(raw), DEVICE_ENGINE_ENV)


def model_architecture(model_dir: str | Path) -> str | None:
    """The first architecture in the model folder's config.json, or None if unreadable."""
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    archs = cfg.get("architectures") or []
    return str(archs[0]) if archs else None


def model_support(model_dir: str | Path) -> str | None:
    """None when vllm-neuron serves this model's family, else the reason (for a skip)."""
    arch = model_architecture(model_dir)
    if arch in SUPPORTED_ARCHITECTURES:
        return None
    families = ", ".join(f"{a} ({f})" for a, f in SUPPORTED_ARCHITECTURES.items())
    return (
        f"model {Path(model_dir).name} ({arch or 'no architectures in config.json'}) is not a"
        f" family {VLLM_NEURON_REF} serves; it runs {families}"
    )


def blocks_to_request(max_model_len: int, max_num_seqs: int, block_size: int) -> int:
    """vllm-neuron's README formula, ``ceil(max_model_len // block_size) * max_num_seqs``:
    the blocks the harness asks for; the platform adds the null block to it."""
    return math.ceil(max_model_len // block_size) * max_num_seqs


def neuron_llm_kwargs(cfg: EngineConfig, settings: NeuronEngineSettings) -> dict[str, Any]:
    """The vllm-neuron-specific ``vllm.LLM`` arguments for an engine configuration."""
    block_size = cfg.block_size if cfg.block_size is not None else cfg.max_model_len
    if block_size != cfg.max_model_len:
        raise ConfigError(
            f"{cfg.label}: block_size {block_size} != max_model_len {cfg.max_model_len}; without"
            " prefix caching vllm-neuron sets block_size = max_model_len itself"
        )
    blocks = cfg.num_blocks_override
    if blocks is None:
        blocks = blocks_to_request(cfg.max_model_len, cfg.max_num_seqs, block_size)
    override = dict(settings.override_neuron_config)
    override["on_device_sampling_config"] = None  # sample on the host: logprobs come back
    return {
        "block_size": block_size,
        "num_gpu_blocks_override": blocks,
        "tensor_parallel_size": settings.tensor_parallel_size,
        "dtype": settings.dtype,
        "additional_config": {"override_neuron_config": override},
        "enable_prefix_caching": False,
    }


def compiled_artifacts_dir(cache_root: Path, cfg: EngineConfig, llm_kwargs: Mapping[str, Any]) -> Path:
    """One folder per compiled shape: vllm-neuron loads whatever NEURON_COMPILED_ARTIFACTS holds."""
    shape = {k: llm_kwargs.get(k) for k in ("model", "max_model_len", "max_num_seqs", "block_size",
                                             "num_gpu_blocks_override", "tensor_parallel_size",
                                             "dtype", "additional_config")}
    shape["vllm_neuron"] = VLLM_NEURON_REF
    digest = hashlib.sha256(json.dumps(shape, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return cache_root / "neuron-compiled" / f"{Path(cfg.model).name}-{digest}"


def check_engine_info(info: Mapping[str, Any], cores: str | None,
                      dtype: str | None = None) -> str | None:
    """After start: why the engine is not vllm-neuron's platform on the leased cores computing
    in ``dtype`` (the inventory's, when given), or None."""
    platform = f"{info.get('platform_module', '?')}.{info.get('platform', '?')}"
    if platform != "vllm_neuron.platform.NeuronPlatform":
        return (
            f"the engine runs platform {platform}, not vllm_neuron.platform.NeuronPlatform:"
            " vllm-neuron did not register (no /dev/neuron* in the engine's view, or"
            " VLLM_PLUGINS does not name neuron)"
        )
    seen = info.get("visible_cores")
    if cores is not None and seen != cores:
        return (
            f"the engine process has {CORES_ENV}={seen!r}, but the lease gave cores {cores!r}:"
            " the engine may run on another lease's cores"
        )
    got = info.get("model_dtype")
    if dtype is not None and got != f"torch.{dtype}":
        return (
            f"the inventory gives the device engine.dtype {dtype}, but the engine's model computes"
            f" in {got or 'an unreported dtype'}: its trace would be judged by the wrong"
            " precision's tolerances"
        )
    return None


def check_block_geometry(info: Mapping[str, Any], max_model_len: int, max_num_seqs: int,
                         requested: int | None = None) -> str | None:
    """Why an engine's KV pool is not the Neuron geometry, or None.

    The Neuron geometry: blocks of ``max_model_len`` tokens, and a pool of the requested
    blocks (``max_num_seqs`` unless a test asked otherwise) plus the null block vLLM keeps as
    block 0, so that ``max_num_seqs`` full-length requests fit at once. ``info`` carries the
    engine's ``block_size`` and ``num_gpu_blocks`` (the pool, null block included).
    """
    want_blocks = (requested if requested is not None else max_num_seqs) + 1
    size, blocks = info.get("block_size"), info.get("num_gpu_blocks")
    if size != max_model_len:
        return (f"KV block size {size}, expected max_model_len {max_model_len}: vllm-neuron"
                " keeps one block per sequence when prefix caching is off")
    if blocks != want_blocks:
        extra = blocks - want_blocks if isinstance(blocks, int) else None
        why = {1: "the null block was added twice (by the harness and by vllm-neuron)",
               -1: "the null block is missing (vllm-neuron did not add it): one request of a"
                   " full batch would be held back"}.get(extra, "the plugin's arithmetic changed")
        return (f"KV pool of {blocks} blocks, expected {want_blocks} ({want_blocks - 1} requested"
                f" + 1 null block): {why}")
    return None


def inventory_env(e: dict[str, Any], where: str) -> dict[str, str]:
    """A Neuron device's cores and engine table, as the environment its lease carries."""
    out: dict[str, str] = {}
    cores = e.get("cores")
    if cores is not None:
        if not isinstance(cores, str) or not all(p.strip().isdigit() for p in cores.replace("-", ",").split(",")):
            raise ConfigError(f"{where}: cores {cores!r} must be like \"0-1\" or \"4\"")
        out[CORES_ENV] = cores
    if "engine" in e:
        out[DEVICE_ENGINE_ENV] = parse_engine_settings(e["engine"], where).to_json()
    return out
