"""Whether a geometry fits this machine: the KV cache a full batch of full-length requests
needs for a model, against the memory the host has, judged before any engine starts."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from harness.geometry.catalog import Geometry

GIB = 1024**3
# Of the memory available when the run starts, what the KV caches of one engine may take: the
# reference, the models' weights and a second worker's engine need the rest.
KV_SHARE = 0.25
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def available_memory() -> int | None:
    """Bytes the kernel says are available now (MemAvailable), None where it does not say."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def kv_bytes_per_token(config: Mapping[str, Any]) -> int:
    """Bytes of K and V one token takes in every layer of a model with this HF ``config``
    (float32, the CPU paths' dtype, unless the config says narrower)."""
    layers = int(config.get("num_hidden_layers", 1))
    heads = int(config.get("num_attention_heads", 1))
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or int(config.get("hidden_size", heads)) // heads)
    width = DTYPE_BYTES.get(str(config.get("torch_dtype", "float32")), 4)
    width = max(width, 4)  # the CPU paths compute in float32 whatever the checkpoint holds
    return 2 * layers * kv_heads * head_dim * width


def kv_need(geometry: Geometry, config: Mapping[str, Any]) -> int:
    """Bytes of KV cache one engine of ``geometry`` holds for a model with this ``config``:
    a full batch of full-length requests, or the declared block count's worth when larger."""
    tokens = geometry.full_batch_tokens
    if geometry.num_blocks is not None:
        tokens = max(tokens, geometry.num_blocks * min(geometry.max_model_len, 64))
    per_rank = math.ceil(tokens * kv_bytes_per_token(config) / geometry.tensor_parallel_size)
    return per_rank * geometry.tensor_parallel_size


def fit_problem(geometry: Geometry, model: str, config: Mapping[str, Any],
                available: int | None = None) -> str | None:
    """Why ``geometry`` cannot run ``model`` on this machine (the memory it would need against
    what the host has), or None: it fits."""
    have = available if available is not None else available_memory()
    if have is None:
        return None
    need = kv_need(geometry, config)
    if need <= have * KV_SHARE:
        return None
    return (f"geometry {geometry.name!r} ({geometry.describe().split(': ', 1)[1]}) needs about"
            f" {need / GIB:.1f} GiB of KV cache for model {model} (a full batch of full-length"
            f" requests), more than the {KV_SHARE:.0%} of this machine's {have / GIB:.1f} GiB"
            " available that one engine may take: run it on a host with at least"
            f" {math.ceil(need / KV_SHARE / GIB)} GiB available, or pick a smaller geometry")

