"""neuron: vllm-neuron on AWS Inferentia/Trainium devices (values explained in harness.neuron_config)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from harness.engine_config import ConfigError
from harness.neuron_config import (
    CORES_ENV,
    check_block_geometry,
    check_engine_info,
    compiled_artifacts_dir,
    model_support,
    neuron_llm_kwargs,
    settings_from_env,
)
from harness.targets.base import VllmTarget

ROOT = Path(__file__).resolve().parents[2]
# The stack whose venv has vllm-neuron on the host's Neuron SDK (stacks/neuron.toml).
NEURON_STACK = "neuron"


class NeuronTarget(VllmTarget):
    name = "neuron"

    @classmethod
    def availability_probe(cls, variant: Any) -> str | None:
        from harness.devices import discover_neuron

        scan = discover_neuron()
        if not scan.usable:
            return scan.why_none()
        return None

    @classmethod
    def stack_probe(cls, variant: Any, stack: str) -> str | None:
        """Engines of this target run only in the neuron stack's venv (vllm-neuron + the SDK)."""
        if stack == NEURON_STACK:
            return None
        from harness.devices import discover_neuron

        device = discover_neuron().why_none() or "Neuron device(s) present"
        return (
            f"{device}; and neuron engines run only on the {NEURON_STACK} stack (vllm-neuron on"
            f" the host's Neuron SDK), not on stack {stack!r}: on a Neuron host run"
            f" ./setup.sh --stack {NEURON_STACK}, then hil run --stacks {NEURON_STACK} -m neuron"
        )

    @classmethod
    def model_probe(cls, model_dir: str | Path) -> str | None:
        return model_support(model_dir)

    def _cores(self) -> str | None:
        return dict(self.cfg.extra_env).get(CORES_ENV)

    def engine_env(self) -> dict[str, str]:
        env = super().engine_env()
        env["VLLM_PLUGINS"] = "neuron"
        if self.cfg.device is not None and self._cores() is None:
            raise ConfigError(
                f"Neuron device {self.cfg.device} has no core range: list it in an inventory"
                f" with cores = \"FIRST-LAST\" (its {CORES_ENV}), so its engines stay on its cores"
            )
        # The fixtures point VLLM_CACHE_ROOT into the harness cache folder.
        cache_root = Path(os.environ.get("VLLM_CACHE_ROOT") or ROOT / ".hil-cache" / "vllm")
        env["NEURON_COMPILED_ARTIFACTS"] = str(
            compiled_artifacts_dir(cache_root, self.cfg, self.llm_kwargs()))
        return env

    def llm_kwargs(self) -> dict[str, Any]:
        kw = super().llm_kwargs()
        kw.update(neuron_llm_kwargs(self.cfg, settings_from_env(dict(self.cfg.extra_env))))
        return kw

    def check_started(self, info: dict[str, Any]) -> str | None:
        cfg = self.cfg
        return check_engine_info(info, self._cores()) or check_block_geometry(
            info, cfg.max_model_len, cfg.max_num_seqs, cfg.num_blocks_override)
