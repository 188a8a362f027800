"""What every vLLM-served target shares: offline environment, request checks."""

from __future__ import annotations

from typing import Any

from harness.engine_config import ConfigError, EngineConfig

# Nothing may come from a model hub or phone home during a run.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_HOST_IP": "127.0.0.1",
    # Keep the engine core in the engine process so the scheduler, KV-cache
    # manager and model runner can be read between steps.
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_USE_V1": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


class VllmTarget:
    """A device kind served through vLLM; subclasses add their env and limits."""

    name = "vllm"

    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg

    @classmethod
    def availability_probe(cls, variant: Any) -> str | None:
        """None when this machine can run ``variant``, else a precise reason to skip."""
        return None

    @classmethod
    def stack_probe(cls, variant: Any, stack: str) -> str | None:
        """None when engines of ``variant`` can run on ``stack``, else why not (device-missing)."""
        return None

    @classmethod
    def model_probe(cls, model_dir: Any) -> str | None:
        """None when this target serves the model's family, else why not (a skip)."""
        return None

    def check_started(self, info: dict[str, Any]) -> str | None:
        """After start: why the engine is not what this target asked for, or None."""
        return None

    def engine_env(self) -> dict[str, str]:
        """Environment variables the engine process needs, on top of the inherited one."""
        return dict(OFFLINE_ENV)

    def llm_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``vllm.LLM``."""
        cfg = self.cfg
        kw: dict[str, Any] = {
            "model": cfg.model,
            "tokenizer": cfg.model,
            "max_model_len": cfg.max_model_len,
            "max_num_seqs": cfg.max_num_seqs,
            "seed": 0,
            "disable_log_stats": False,
            # Shared prefix blocks would make block ownership ambiguous.
            "enable_prefix_caching": False,
        }
        if cfg.block_size is not None:
            kw["block_size"] = cfg.block_size
        if cfg.num_blocks_override is not None:
            kw["num_gpu_blocks_override"] = cfg.num_blocks_override
        if cfg.max_num_batched_tokens is not None:
            kw["max_num_batched_tokens"] = cfg.max_num_batched_tokens
        return kw

    def check_request(self, prompt_len: int, max_tokens: int) -> None:
        """Raise ConfigError when the engine would refuse this request."""
        if prompt_len + max_tokens > self.cfg.max_model_len:
            raise ConfigError(
                f"prompt of {prompt_len} tokens + max_tokens {max_tokens} exceeds"
                f" max_model_len {self.cfg.max_model_len} on {self.cfg.label};"
                " shorten the prompt, lower max_tokens or raise max_model_len"
            )
