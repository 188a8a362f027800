"""Faults in a model kernel: numbers that are wrong at every step, the size of a real kernel bug.

``attn-scale`` multiplies the softmax scale of every attention layer vLLM builds (the
``1/sqrt(head_dim)`` a kernel takes): an attention kernel that scales its scores wrongly.
Unlike the logits faults it acts inside the model, so the damage flows through every layer
and every later position, as a kernel error does; it is the engine-side twin of the
calibration's own ``--attn-scale`` fault (``harness.calibration.measure.scale_attention``).

``scale-partial-sum`` multiplies the partial result the rank it is installed in contributes
to every all-reduce of the tensor-parallel layers: with ``rank=1`` one rank of a
tensor-parallel engine computes its share wrongly while rank 0's own share, its KV and its
ledgers stay right (a rank whose kernel, card or collective is broken).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from harness.in_engine.fault_registry import armed, fault

# Where vLLM's attention layer lives: vLLM 0.28 and later, then earlier releases.
_ATTENTION_MODULES = ("vllm.model_executor.layers.attention.attention", "vllm.attention.layer")


def _attention_class() -> Any:
    for name in _ATTENTION_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        cls = getattr(module, "Attention", None)
        if cls is not None:
            return cls
    raise RuntimeError(f"no vLLM Attention layer found in {', '.join(_ATTENTION_MODULES)}")


@fault("attn-scale")
def attn_scale(config: dict[str, Any], factor: str = "1.08") -> None:
    """Every attention layer vLLM builds computes with its score scale times ``factor``
    (1.08: an 8 % error), from the first forward on."""
    f = float(factor)
    cls = _attention_class()
    original = cls.__init__
    said = {"done": False}

    def __init__(self: Any, num_heads: int, head_size: int, scale: float, *a: Any,
                 **kw: Any) -> None:
        if not said["done"]:
            said["done"] = True
            print(f"[hil] fault attn_scale installed: attention scale x{f:g}", flush=True)
        original(self, num_heads, head_size, float(scale) * f, *a, **kw)

    cls.__init__ = __init__


# The all-reduce of the tensor-parallel layers: vLLM's own models (``GroupCoordinator``, the
# method ``tensor_model_parallel_all_reduce`` calls) and the foundation-model-stack models the
# Spyre plugins run (a module function its autograd regions call by name).
_VLLM_GROUP = ("vllm.distributed.parallel_state", "GroupCoordinator")
_FMS_TP = "fms.distributed.tensorparallel"


@fault("scale-partial-sum")
def scale_partial_sum(config: dict[str, Any], factor: str = "1.5") -> None:
    """Once armed, the partial result this process contributes to every tensor-parallel
    all-reduce is multiplied by ``factor`` (with ``rank=N``: rank N's alone)."""
    f = float(factor)
    said = {"done": False}

    def scaled(input_: Any) -> Any:
        if not armed():
            return input_
        if not said["done"]:
            said["done"] = True
            print(f"[hil] fault scale-partial-sum fired: this rank's partial sums x{f:g}",
                  flush=True)
        return input_ * f

    patched = []
    module_name, cls_name = _VLLM_GROUP
    group = getattr(importlib.import_module(module_name), cls_name)
    original_group = group.all_reduce

    def all_reduce(self: Any, input_: Any, *a: Any, **kw: Any) -> Any:
        if getattr(self, "world_size", 1) > 1:
            input_ = scaled(input_)
        return original_group(self, input_, *a, **kw)

    group.all_reduce = all_reduce
    patched.append(f"{module_name}.{cls_name}.all_reduce")
    try:
        fms_tp = importlib.import_module(_FMS_TP)
    except ImportError:
        fms_tp = None
    if fms_tp is not None and hasattr(fms_tp, "_all_reduce"):
        original_fms = fms_tp._all_reduce

        def fms_all_reduce(input_: Any, pg: Any, *a: Any, **kw: Any) -> Any:
            return original_fms(scaled(input_), pg, *a, **kw)

        fms_tp._all_reduce = fms_all_reduce
        patched.append(f"{_FMS_TP}._all_reduce")
    print(f"[hil] fault scale-partial-sum installed in pid {os.getpid()}: {', '.join(patched)}",
          flush=True)
