"""The plugin's model registry entry an engine runs with: which one the plugin applied, what it
declares, and whether the engine got it.

On the sendnn backend sendnn-inference matches the model's architecture and the engine's shape
(TP, context, batch) against its registry (``config/model_configs.yaml``, or the lab's file in
``SENDNN_INFERENCE_MODEL_CONFIG_FILE``) and applies the entry's device settings: a KV block
count (``num_gpu_blocks_override``) and variables (the batch TKV limit, ``FLEX_HDMA_*``...).
``applied_entry`` runs in the engine process after start and asks the plugin's own registry
which entry applies to the engine's configuration; ``entry_problem`` holds the engine to it on
the harness side: the blocks its KV cache really has, and each variable as the engine process
has it. The report names the entry (``registry entry``).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from harness.core.config import ConfigError
from harness.targets.spyre.registry import TKV_LIMIT_ENV

MODEL_CONFIG_FILE_ENV = "SENDNN_INFERENCE_MODEL_CONFIG_FILE"


def applied_entry(vllm_config: Any) -> dict[str, Any] | None:
    """Engine side: the registry entry the plugin applies to ``vllm_config`` and what it
    declares, beside what this process runs with; None where the plugin applies none (another
    backend, a plugin generation without a registry)."""
    try:
        from sendnn_inference import envs  # deferred: the plugin, inside an engine only
        from sendnn_inference.config.model_registry import get_model_registry
    except ImportError:
        return None
    if vllm_config is None or envs.SENDNN_INFERENCE_DYNAMO_BACKEND != "sendnn":
        return None
    registry = get_model_registry()
    configurator = registry.get_configurator_for_runtime(vllm_config)
    facts: dict[str, Any] = {"file": os.environ.get(MODEL_CONFIG_FILE_ENV) or "the plugin's own",
                             "entry": None}
    if configurator is None:
        return facts
    device = configurator.device_config
    declared_env = {k: str(v) for k, v in (device.env_vars if device else {}).items()}
    facts.update(
        entry=configurator.model_config.name,
        tensor_parallel_size=int(vllm_config.parallel_config.tensor_parallel_size),
        declared_blocks=device.num_gpu_blocks_override if device else None,
        declared_env=declared_env,
        env={k: os.environ.get(k) for k in declared_env},
        blocks_override=vllm_config.cache_config.num_gpu_blocks_override,
    )
    return facts


def entry_problem(info: dict[str, Any]) -> str | None:
    """Harness side: why the started engine does not run with what its registry entry
    declares (its KV blocks, each variable), or None (no entry applied, or all as declared)."""
    facts = info.get("registry") or {}
    if facts.get("error"):  # the engine could not ask the plugin's registry: nothing held
        return (f"the plugin's registry could not be asked, in the engine, which entry it"
                f" applied: {facts['error']}")
    entry = facts.get("entry")
    if not entry:
        return None
    where = f"the plugin's registry entry {entry!r} ({facts.get('file')})"
    declared = facts.get("declared_blocks")
    blocks = info.get("kv_num_blocks")
    if declared is not None:
        # The platform rounds an override down to a multiple of the batch size (the card's
        # programs are compiled per batch): what the entry gives the engine.
        seqs = info.get("max_num_seqs") or 1
        expected = declared // seqs * seqs
        if blocks != expected:
            rounded = (f" (rounded down to a multiple of batch {seqs}: {expected})"
                       if expected != declared else "")
            return (f"{where} declares num_gpu_blocks_override {declared}{rounded}, but the"
                    f" engine's KV cache has {blocks} blocks (the override it ran with:"
                    f" {facts.get('blocks_override')})")
    env = facts.get("env") or {}
    for key, value in sorted((facts.get("declared_env") or {}).items()):
        if env.get(key) != value:
            return (f"{where} declares {key}={value}, but the engine process runs with"
                    f" {key}={env.get(key)}")
    return None


def entry_label(info: dict[str, Any]) -> str | None:
    """The entry as the report names it, or None where none applied."""
    facts = info.get("registry") or {}
    if not facts.get("entry"):
        return None
    extra = [f"{facts['declared_blocks']} blocks"] if facts.get("declared_blocks") else []
    tkv = (facts.get("declared_env") or {}).get(TKV_LIMIT_ENV)
    if tkv:
        extra.append(f"TKV limit {tkv}")
    return f"{facts['entry']} (TP {facts.get('tensor_parallel_size')}" + \
        "".join(f", {e}" for e in extra) + ")"


def registry_file() -> Path | None:
    """The registry an engine of this environment reads: the lab's file
    (``SENDNN_INFERENCE_MODEL_CONFIG_FILE``), else the installed plugin's own; None where no
    sendnn-inference is installed."""
    lab = os.environ.get(MODEL_CONFIG_FILE_ENV)
    if lab:
        return Path(lab)
    spec = importlib.util.find_spec("sendnn_inference")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "config" / "model_configs.yaml"


def _shape_of(cb: Mapping[str, Any]) -> str:
    return f"TP {cb.get('tp_size')}, context {cb.get('max_model_len')}, batch {cb.get('max_num_seqs')}"


def entry_geometry(entry: str, chosen: Mapping[str, Any]) -> dict[str, Any]:
    """The geometry values of registry entry ``entry`` (read as the plugin reads its file, on
    the harness side, nothing imported): the continuous-batching shape that ``chosen`` (the
    geometry's own ``tensor_parallel_size``, ``max_model_len``, ``max_num_seqs``) leaves, the
    device's pool (the entry's block count applies there) and its batch TKV limit. Raises
    ConfigError naming the file and the shapes it has when none or several are left."""
    path = registry_file()
    if path is None:
        raise ConfigError("no sendnn-inference is installed, whose registry names the entries;"
                          f" set {MODEL_CONFIG_FILE_ENV} to a registry file")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"the registry {path} cannot be read: {e}") from None
    models = data.get("models") if isinstance(data, dict) else None
    if not isinstance(models, dict) or entry not in models:
        known = ", ".join(models) if isinstance(models, dict) else "none"
        raise ConfigError(f"the registry {path} has no entry {entry!r} (entries: {known})")
    shapes = [c for c in (models[entry] or {}).get("continuous_batching_configs") or []
              if isinstance(c, dict)]
    pick = {"tensor_parallel_size": "tp_size", "max_model_len": "max_model_len",
            "max_num_seqs": "max_num_seqs"}
    left = [c for c in shapes if all(c.get(key) == chosen[k] for k, key in pick.items()
                                     if k in chosen)]
    if len(left) != 1:
        asked = ", ".join(f"{k} = {v}" for k, v in chosen.items() if k in pick) or "nothing"
        have = "; ".join(_shape_of(c) for c in shapes) or "none"
        what = "none matches" if not left else f"{len(left)} match"
        raise ConfigError(f"its continuous-batching shapes in {path} are: {have}; {what} what"
                          f" the geometry gives ({asked}): give tensor_parallel_size,"
                          " max_model_len or max_num_seqs to pick one")
    cb = left[0]
    out: dict[str, Any] = {"tensor_parallel_size": int(cb["tp_size"]),
                           "max_model_len": int(cb["max_model_len"]),
                           "max_num_seqs": int(cb["max_num_seqs"]), "pool": "device"}
    env = ((cb.get("device_config") or {}).get("env_vars") or {})
    if TKV_LIMIT_ENV in env:
        out["batch_tkv_limit"] = int(env[TKV_LIMIT_ENV])
    return out
