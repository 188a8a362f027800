"""The names of the Spyre plugin's own KV ledgers, as ``KvSnapshot.source`` carries them.

Written by the readers in ``ledger.py`` (in the engine process) and declared by the kind's
``ledger_sources``; vLLM's own scheduler ledger is ``harness.core.trace.SOURCE_VLLM_SCHEDULER``.
A module of its own: the kind declares them without importing the engine-side readers.
"""

from __future__ import annotations

# vllm-spyre 1.x: the runner's own kv_cache_manager and its block pool.
SOURCE_SPYRE_RUNNER = "spyre-runner"
# vllm-spyre 0.3.x-0.4.0: the runner's free_blocks deque and req_ids2blocks.
SOURCE_SPYRE_LEGACY_RUNNER = "spyre-legacy-runner"

LEDGER_SOURCES = (SOURCE_SPYRE_RUNNER, SOURCE_SPYRE_LEGACY_RUNNER)
