"""Target variants: each (target, backend, mode) a suite runs on, with its markers.

The variants are declared by their kinds (``harness/targets/<kind>.py``); this
module is the selection ``--target`` makes among them.
"""

from __future__ import annotations

from harness.targets import KINDS, all_modes, all_variants, engine_kinds
from harness.targets.base import TargetVariant

__all__ = ["VARIANTS", "TargetVariant", "select_variants"]

VARIANTS: dict[str, TargetVariant] = all_variants()


def select_variants(spec: str | None) -> list[TargetVariant]:
    """Variants named by ``--target``: ids or kinds, comma-separated; all when empty.

    ``spyre`` selects every spyre variant, ``spyre-eager`` the CPU-mode ones,
    ``cb`` every continuous-batching one; a variant's id selects that variant alone
    (``vllm-cpu``: not ``vllm-cpu-bf16``, which ``-m cpu`` and a run without ``--target``
    include). An opt-in variant (``TargetVariant.opt_in``) is
    selected only by its id or its mode.
    """
    if not spec:
        return [v for v in VARIANTS.values() if not v.opt_in]
    words = [w.strip() for w in spec.split(",") if w.strip()]
    if not words:
        raise ValueError(f"{spec!r} names no target; name one or more of: {', '.join(VARIANTS)}"
                         " (or leave the option out to run all)")
    chosen: dict[str, TargetVariant] = {}
    for word in words:
        # A variant's own id names that variant alone (vllm-cpu, not vllm-cpu-bf16 too);
        # otherwise a kind or an id prefix names every variant under it.
        named = any(v.id == word for v in VARIANTS.values())
        hits = [
            v
            for v in VARIANTS.values()
            if v.id == word or v.mode == word
            or (not named and not v.opt_in
                and (v.target == word or v.id.startswith(word + "-")))
        ]
        if not hits:
            kinds = ", ".join(k for k in engine_kinds() if KINDS[k].variants)
            raise ValueError(
                f"unknown target {word!r}; known: {', '.join(VARIANTS)}"
                f" (or a kind: {kinds}; or a mode: {', '.join(all_modes())})"
            )
        for v in hits:
            chosen[v.id] = v
    return [v for v in VARIANTS.values() if v.id in chosen]
