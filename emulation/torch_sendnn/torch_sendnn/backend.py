"""The ``sendnn`` torch.compile backend, computing the traced graph on the CPU.

The vendor backend compiles the graph for the card and deploys it on first run; here the first
run opens the card (``device.open_device``) and every run executes the FX graph on the CPU in fp16,
as the card computes: fp32 graph inputs (weights of an fp32 checkpoint) are converted to fp16, as
the card's compiler does (assumed; vllm-spyre casts only bf16 weights itself). Tensors already in
fp16 (the KV cache, written in place) pass through untouched.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from torch_sendnn import compiler, device
from torch_sendnn.log import dtlog

_opened: str | None = None


def _cache_record(gm: Any, options: dict[str, Any]) -> None:
    if os.environ.get("TORCH_SENDNN_CACHE_ENABLE", "0") not in ("1", "true"):
        return
    cache_dir = os.environ.get("TORCH_SENDNN_CACHE_DIR")
    if not cache_dir:
        return
    digest = hashlib.sha256((gm.code + json.dumps(options, sort_keys=True)).encode()).hexdigest()[:16]
    path = Path(cache_dir) / f"graph-{digest}.json"
    if path.exists():
        dtlog("INFO", f"torch_sendnn cache hit {path.name}")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"options": options, "nodes": len(gm.graph.nodes)}))


def sendnn(gm: Any, example_inputs: list[Any], options: dict[str, Any] | None = None) -> Callable[..., Any]:
    """Dynamo backend: refuse a shape the card does not compile, record the compile, open
    the card on first run, run on the CPU."""
    compiler.check_dynamic_shape(dict(options or {}))
    _cache_record(gm, dict(options or {}))

    weights: dict[int, tuple[Any, Any]] = {}  # id(fp32 parameter) -> (parameter, fp16 copy)

    def fp16(arg: Any) -> Any:
        if not isinstance(arg, torch.Tensor) or arg.dtype != torch.float32:
            return arg
        if isinstance(arg, torch.nn.Parameter):
            hit = weights.get(id(arg))
            if hit is None or hit[0] is not arg:
                hit = weights[id(arg)] = (arg, arg.detach().to(torch.float16))
            return hit[1]
        return arg.to(torch.float16)

    def run(*args: Any) -> Any:
        global _opened
        if _opened is None:
            _opened = device.open_device()
        return gm.forward(*[fp16(a) for a in args])

    return run


def register_backend() -> None:
    from torch._dynamo.backends.registry import _BACKENDS, register_backend

    if "sendnn" not in _BACKENDS:
        register_backend(sendnn, name="sendnn")
