"""vllm-cpu: the real vLLM V1 engine on its CPU platform."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from harness.stacks.spec import stack_version
from harness.targets.base import CPU_DEVICE, PoolGeometry, TargetVariant, VllmTarget
from harness.targets.declarations import cpu_rank_binding, cpu_tensor_parallel_problem

SMALL_BLOCK = 16
WIDER_BLOCK = 32
WIDER_FROM = (0, 29)
# vLLM's V1 scheduler admits a request at any step and keeps its blocks in its KVCacheManager;
# the harness sizes its pool (and preflights a too-small one: vLLM does not refuse it); its
# prefix cache (off unless asked) serves whole blocks.
CAPABILITIES = ("kv_ledger", "harness_sized_pool", "prefix_caching")


class VllmCpuTarget(VllmTarget):
    name = "vllm-cpu"
    chunks_prefill = True  # V1 chunks a prompt longer than max_num_batched_tokens
    order = 10
    device = CPU_DEVICE
    # vllm-cpu-bf16 computes in bfloat16: a card's reduced precision on the CPU, judged by the
    # calibrated bf16 noise (harness.calibration). Precision shows in the numbers, not in the
    # KV blocks, so it runs the token-equality suite only.
    variants = (
        TargetVariant("vllm-cpu", "vllm-cpu", None, None, ("cpu",), capabilities=CAPABILITIES),
        TargetVariant("vllm-cpu-bf16", "vllm-cpu", "bf16", None, ("cpu",),
                      suites=("token_equality",), capabilities=CAPABILITIES),
    )
    backends = ("bf16",)
    backend_help = "bf16 computes in bfloat16; without a backend the engine computes in float32"
    backend_precisions = {"bf16": "bf16"}
    # Other kinds' CPU variants carry it too; the registry joins their descriptions.
    markers = {"cpu": "runs on this machine's CPU (vllm-cpu)"}
    selftest_module = "harness.targets.vllm_cpu.selftest_cases"
    plugin_preload = {
        "vllm.platforms.cpu": ("vllm.v1.worker.cpu_worker", "vllm.v1.worker.cpu_model_runner"),
    }
    # The suites choose the pool: small blocks (vLLM's paged layout; the size the stack's
    # vLLM takes, ``stack_geometry``) or one block per sequence (block_size = max_model_len:
    # the Neuron geometry, on the CPU).
    geometries = {
        "paged": PoolGeometry(SMALL_BLOCK),
        "one-block-per-sequence": PoolGeometry(None),
    }
    sized_pool_geometry = "paged"

    @classmethod
    def stack_geometry(cls, name: str, stack: str) -> PoolGeometry:
        """vLLM's CPU attention declares the block sizes it takes
        (``CPUAttentionBackend.get_supported_kernel_block_sizes``): multiples of 16 on vLLM
        0.17 and 0.28, of 32 on 0.32 (each read in the installed code). Small blocks keep the
        per-step probe small and put block edges inside short prompts, so the paged geometry
        takes 16 where it can and 32 from vLLM 0.29 on (a multiple of 16 as well, so right
        whichever rule the releases between 0.28 and 0.32 declare)."""
        geometry = cls.geometry(name)
        version = stack_version(stack, "vllm-cpu", "vllm")
        if geometry.block_size == SMALL_BLOCK and version is not None and version >= WIDER_FROM:
            return replace(geometry, block_size=WIDER_BLOCK)
        return geometry

    @classmethod
    def full_batch_pool(cls, max_model_len: int, max_num_seqs: int,
                        stack: str = "default") -> dict[str, int]:
        # vLLM sizes its pool from memory; the harness sizes it from the block formula so
        # that a full batch of full-length requests fills it exactly.
        return cls.stack_geometry("paged", stack).engine_overrides(max_model_len, max_num_seqs)

    @classmethod
    def tensor_parallel_problem(cls, variant: TargetVariant, ranks: int,
                                stack: str) -> str | None:
        return cpu_tensor_parallel_problem(ranks, stack)

    def engine_env(self) -> dict[str, str]:
        env = super().engine_env()
        # An installed vllm-spyre would otherwise take over the platform.
        env["VLLM_PLUGINS"] = ""
        ranks = self.cfg.tensor_parallel_size
        binding = cpu_rank_binding(ranks) if ranks > 1 else None
        if binding and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:  # a lab's own binding wins
            # Each rank's threads on cores of their own (vLLM's "auto" binds by NUMA node).
            env["VLLM_CPU_OMP_THREADS_BIND"] = binding
        env["VLLM_CPU_KVCACHE_SPACE"] = "1"
        # With enforce_eager the only torch.compile left is the sampler's logprob-rank
        # helper, which inductor builds with gcc on first use: 12 s per engine, every
        # engine. Eager gives the same numbers (cf. VLLM_SPYRE_SIMPLE_COMPILE_BACKEND).
        env["TORCH_COMPILE_DISABLE"] = "1"
        return env

    def dtype(self) -> str:
        """The dtype this engine asks vLLM for."""
        return "bfloat16" if self.cfg.backend == "bf16" else "float32"

    def check_started(self, info: dict[str, Any]) -> str | None:
        """The engine computes in the dtype asked for: a bf16 engine that fell back to fp32
        would pass the bf16 target's wider tolerances for the wrong reason."""
        got = info.get("model_dtype")
        if got != f"torch.{self.dtype()}":
            return (f"asked vLLM for dtype {self.dtype()}, but the engine's model computes in"
                    f" {got or 'an unreported dtype'}")
        return None

    def llm_kwargs(self) -> dict[str, Any]:
        kw = super().llm_kwargs()
        # Synchronous scheduling: each engine step is complete when it returns,
        # so the scheduler and KV state read between steps is coherent.
        kw.update(dtype=self.dtype(), enforce_eager=True, async_scheduling=False)
        return kw


KIND = VllmCpuTarget
