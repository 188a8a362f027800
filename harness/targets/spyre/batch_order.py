"""The Spyre kind's ``batch-order`` runner hook (``SpyreTarget.runner_hooks``): where
sendnn-inference's chunked-prefill runner runs the engine, it publishes its batch order before
it samples, so the row-corruption faults (``harness.in_engine.faults.conditions``) corrupt the
due request's row. Called by name in the engine process, after vLLM has built the engine's
platform; vllm-spyre 1.x's runners keep no batch order of their own there (row 0 is used).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from typing import Any

from harness.targets.spyre.generations import SENDNN_INFERENCE

RUNNER_MODULE = f"{SENDNN_INFERENCE.module}.v1.worker.spyre_model_runner"


def publish_batch_order(publish: Callable[[list[str] | None], None]) -> bool:
    """Where sendnn-inference's platform runs this engine: make its ``ChunkedPrefillModelRunner``
    call ``publish(request ids by batch row, or None)`` before each ``sample_tokens``, and say
    True; False elsewhere (nothing patched)."""
    if importlib.util.find_spec(SENDNN_INFERENCE.module) is None:
        return False
    from vllm.platforms import current_platform  # defers a heavy import

    if SENDNN_INFERENCE.module not in type(current_platform).__module__:
        return False
    runner = importlib.import_module(RUNNER_MODULE).ChunkedPrefillModelRunner
    sample_tokens = runner.sample_tokens

    def publishing_sample_tokens(self: Any, *a: Any, **kw: Any) -> Any:
        state = getattr(self, "_pending_sampling_state", None)
        publish(None if state is None else list(state.batch_req_ids))
        return sample_tokens(self, *a, **kw)

    runner.sample_tokens = publishing_sample_tokens
    return True
