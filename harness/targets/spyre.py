"""spyre: the real vllm-spyre plugin; eager on the CPU, sendnn on a card."""

from __future__ import annotations

import importlib.util
import math
import socket
from typing import Any

from harness.engine_config import SPYRE_BLOCK_SIZE, ConfigError
from harness.targets.base import VllmTarget


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SpyreTarget(VllmTarget):
    name = "spyre"

    @classmethod
    def availability_probe(cls, variant: Any) -> str | None:
        if importlib.util.find_spec("vllm_spyre") is None:
            return "vllm-spyre is not installed in this environment; run ./setup.sh"
        if variant.backend != "sendnn":
            return None
        from harness.card import torch_sendnn_status
        from harness.devices import device_root, discover_spyre

        scan = discover_spyre(device_root())
        if not scan.usable:
            return scan.why_none()
        _, problem = torch_sendnn_status()
        if problem:
            return f"{len(scan.usable)} Spyre card(s) found, but {problem}"
        return None

    def engine_env(self) -> dict[str, str]:
        cfg = self.cfg
        env = super().engine_env()
        env.update(
            VLLM_PLUGINS="spyre",
            VLLM_SPYRE_DYNAMO_BACKEND=str(cfg.backend),
            VLLM_SPYRE_USE_CB="0" if cfg.mode == "sb" else "1",
            VLLM_SPYRE_USE_CHUNKED_PREFILL="1" if cfg.mode == "cp" else "0",
            # The worker initialises torch.distributed with init_method="env://".
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(free_port()),
        )
        if cfg.backend == "eager":
            # The default compiles sampler helpers with gcc: ~10 s for nothing on CPU.
            env["VLLM_SPYRE_SIMPLE_COMPILE_BACKEND"] = "eager"
        if cfg.mode == "sb":
            assert cfg.warmup is not None
            env.update(
                VLLM_SPYRE_WARMUP_PROMPT_LENS=str(cfg.warmup.prompt_len),
                VLLM_SPYRE_WARMUP_NEW_TOKENS=str(cfg.warmup.new_tokens),
                VLLM_SPYRE_WARMUP_BATCH_SIZES=str(cfg.warmup.batch_size),
            )
        return env

    def llm_kwargs(self) -> dict[str, Any]:
        kw = super().llm_kwargs()
        if self.cfg.mode == "sb":
            # vllm-spyre derives both limits from the warmup shape.
            w = self.cfg.warmup
            assert w is not None
            kw["max_model_len"] = w.prompt_len + w.new_tokens
            kw["max_num_seqs"] = w.batch_size
        return kw

    def check_request(self, prompt_len: int, max_tokens: int) -> None:
        cfg = self.cfg
        if cfg.mode == "sb":
            w = cfg.warmup
            assert w is not None
            if prompt_len > w.prompt_len or max_tokens > w.new_tokens:
                raise ConfigError(
                    f"request (prompt {prompt_len} tokens, max_tokens {max_tokens}) does not fit"
                    f" the static-batching warmup shape (prompt_len {w.prompt_len}, new_tokens"
                    f" {w.new_tokens}); raise the warmup shape or shorten the request"
                )
            return
        padded = math.ceil(prompt_len / SPYRE_BLOCK_SIZE) * SPYRE_BLOCK_SIZE
        if padded + max_tokens > cfg.max_model_len:
            raise ConfigError(
                f"prompt of {prompt_len} tokens (padded to {padded}, the next multiple of"
                f" {SPYRE_BLOCK_SIZE}) + max_tokens {max_tokens} exceeds max_model_len"
                f" {cfg.max_model_len} on {cfg.label}; shorten the prompt or lower max_tokens"
            )
