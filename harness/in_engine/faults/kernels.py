"""Faults in a model kernel: numbers that are wrong at every step, the size of a real kernel bug.

``attn-scale`` multiplies the softmax scale of every attention layer vLLM builds (the
``1/sqrt(head_dim)`` a kernel takes): an attention kernel that scales its scores wrongly.
Unlike the logits faults it acts inside the model, so the damage flows through every layer
and every later position, as a kernel error does; it is the engine-side twin of the
calibration's own ``--attn-scale`` fault (``harness.calibration.measure.scale_attention``).
"""

from __future__ import annotations

import importlib
from typing import Any

from harness.in_engine.fault_registry import fault

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
