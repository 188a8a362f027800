"""vllm-cpu: the real vLLM V1 engine on its CPU platform."""

from __future__ import annotations

from typing import Any

from harness.targets.base import CPU_DEVICE, PoolGeometry, TargetVariant, VllmTarget


class VllmCpuTarget(VllmTarget):
    name = "vllm-cpu"
    order = 10
    device = CPU_DEVICE
    variants = (TargetVariant("vllm-cpu", "vllm-cpu", None, None, ("cpu",)),)
    markers = {"cpu": "runs on this machine's CPU (vllm-cpu, spyre eager)"}
    plugin_preload = {
        "vllm.platforms.cpu": ("vllm.v1.worker.cpu_worker", "vllm.v1.worker.cpu_model_runner"),
    }
    # The suites choose the pool: 16-token blocks (vLLM's paged layout) or one block
    # per sequence (block_size = max_model_len: the Neuron geometry, on the CPU).
    geometries = {
        "paged": PoolGeometry(16),
        "one-block-per-sequence": PoolGeometry(None),
    }

    @classmethod
    def full_batch_pool(cls, max_model_len: int, max_num_seqs: int) -> dict[str, int]:
        # vLLM sizes its pool from memory; the harness sizes it from the block formula so
        # that a full batch of full-length requests fills it exactly.
        return cls.geometry("paged").engine_overrides(max_model_len, max_num_seqs)

    def engine_env(self) -> dict[str, str]:
        env = super().engine_env()
        # An installed vllm-spyre would otherwise take over the platform.
        env["VLLM_PLUGINS"] = ""
        env["VLLM_CPU_KVCACHE_SPACE"] = "1"
        # With enforce_eager the only torch.compile left is the sampler's logprob-rank
        # helper, which inductor builds with gcc on first use: 12 s per engine, every
        # engine. Eager gives the same numbers (cf. VLLM_SPYRE_SIMPLE_COMPILE_BACKEND).
        env["TORCH_COMPILE_DISABLE"] = "1"
        return env

    def llm_kwargs(self) -> dict[str, Any]:
        kw = super().llm_kwargs()
        # Synchronous scheduling: each engine step is complete when it returns,
        # so the scheduler and KV state read between steps is coherent.
        kw.update(dtype="float32", enforce_eager=True, async_scheduling=False)
        return kw


KIND = VllmCpuTarget
