"""Tokens the model executor runs per request: a preemption signal outside the scheduler.

vLLM's three preemption signals (the ``vllm:num_preemptions`` counter, each request's
``num_preemptions``, the scheduler output's preempted ids) are all written by the
scheduler's one preemption path. What the executor is asked to compute is not: without
prefix caching a request that is never preempted runs exactly its prompt plus its output
minus the last token, once; a recomputed request runs its tokens again. Runs inside the
engine process.
"""

from __future__ import annotations

from typing import Any


class ExecutedTokens:
    """Counts, per engine request id, the tokens each ``execute_model`` call was given."""

    def __init__(self, executor: Any) -> None:
        self._pending: dict[str, int] = {}
        original = executor.execute_model

        def execute_model(scheduler_output: Any, *a: Any, **kw: Any) -> Any:
            counts = getattr(scheduler_output, "num_scheduled_tokens", None) or {}
            for rid, n in counts.items():
                self._pending[str(rid)] = self._pending.get(str(rid), 0) + int(n)
            return original(scheduler_output, *a, **kw)

        executor.execute_model = execute_model

    def take(self) -> dict[str, int]:
        """The counts since the last call (one engine step), then start afresh."""
        out, self._pending = self._pending, {}
        return out
