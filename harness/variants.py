"""Target variants: each (target, backend, mode) a suite runs on, with its markers.

The CPU-mode Spyre runs (eager backend) carry ``cpu``, as vllm-spyre's own
suite does, so ``-m cpu`` is the full run on a machine without cards; the card
runs (sendnn backend) carry ``spyre``, and Neuron runs carry ``neuron``.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.engine_config import EngineConfig, WarmupShape
from harness.scenario import EngineLimits


@dataclass(frozen=True)
class TargetVariant:
    id: str
    target: str
    backend: str | None
    mode: str | None
    markers: tuple[str, ...]
    device: str | None = None  # inventory id of the leased device, once leased
    device_env: tuple[tuple[str, str], ...] = ()

    def on_device(self, device: str, env: dict[str, str]) -> TargetVariant:
        """This variant bound to a leased device and its environment."""
        from dataclasses import replace

        return replace(self, device=device, device_env=tuple(sorted(env.items())))

    def engine_config(
        self, model: str, limits: EngineLimits, **overrides: object
    ) -> EngineConfig:
        """The engine configuration of this variant for a model and engine limits."""
        warmup = None
        if self.mode == "sb":
            if limits.sb_warmup is None:
                raise ValueError(f"{self.id} needs sb_warmup in the prompt set's engine limits")
            warmup = WarmupShape(*limits.sb_warmup)
        kwargs: dict[str, object] = dict(
            target=self.target,
            model=model,
            max_model_len=limits.max_model_len,
            max_num_seqs=limits.max_num_seqs,
            mode=self.mode,
            backend=self.backend,
            warmup=warmup,
            max_num_batched_tokens=limits.cp_chunk if self.mode == "cp" else None,
            device=self.device,
            extra_env=self.device_env,
        )
        kwargs.update(overrides)
        return EngineConfig(**kwargs)  # type: ignore[arg-type]


VARIANTS: dict[str, TargetVariant] = {
    v.id: v
    for v in (
        TargetVariant("vllm-cpu", "vllm-cpu", None, None, ("cpu",)),
        TargetVariant("spyre-eager-sb", "spyre", "eager", "sb", ("cpu", "sb")),
        TargetVariant("spyre-eager-cb", "spyre", "eager", "cb", ("cpu", "cb")),
        TargetVariant("spyre-eager-cp", "spyre", "eager", "cp", ("cpu", "cp")),
        TargetVariant("spyre-sendnn-sb", "spyre", "sendnn", "sb", ("spyre", "sb")),
        TargetVariant("spyre-sendnn-cb", "spyre", "sendnn", "cb", ("spyre", "cb")),
        TargetVariant("spyre-sendnn-cp", "spyre", "sendnn", "cp", ("spyre", "cp")),
        TargetVariant("neuron", "neuron", None, None, ("neuron",)),
    )
}


def select_variants(spec: str | None) -> list[TargetVariant]:
    """Variants named by ``--target``: ids or kinds, comma-separated; all when empty.

    ``spyre`` selects every spyre variant, ``spyre-eager`` the CPU-mode ones,
    ``cb`` every continuous-batching one.
    """
    if not spec:
        return list(VARIANTS.values())
    words = [w.strip() for w in spec.split(",") if w.strip()]
    if not words:
        raise ValueError(f"{spec!r} names no target; name one or more of: {', '.join(VARIANTS)}"
                         " (or leave the option out to run all)")
    chosen: dict[str, TargetVariant] = {}
    for word in words:
        hits = [
            v
            for v in VARIANTS.values()
            if v.id == word or v.target == word or v.id.startswith(word + "-") or v.mode == word
        ]
        if not hits:
            raise ValueError(
                f"unknown target {word!r}; known: {', '.join(VARIANTS)}"
                " (or a kind: vllm-cpu, spyre, neuron; or a mode: sb, cb, cp)"
            )
        for v in hits:
            chosen[v.id] = v
    return [v for v in VARIANTS.values() if v.id in chosen]
