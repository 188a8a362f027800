"""The backend state sendnn-inference 2.x validates when the compile cache is on.

2.x (``SpyrePlatform.maybe_ensure_sendnn_configured``) reads the module attribute ``__state``
and compares ``spyre_graph_cache.deeptools_config["config"]`` with the ``VLLM_DT_*`` variables:
the vendor runtime captures them when it is imported, so a torch_sendnn imported before the
plugin set them keeps the wrong values. The emulation captures them the same way, at import.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

# variable -> the key the runtime's config holds it under (as 2.x compares them)
CAPTURED = {
    "VLLM_DT_CHUNK_LEN": "vllm_chunk_length",
    "VLLM_DT_MAX_CONTEXT_LEN": "vllm_max_context_length",
    "VLLM_DT_MAX_BATCH_SIZE": "vllm_max_batch_size",
    "VLLM_DT_MAX_BATCH_TKV_LIMIT": "vllm_max_batch_tkv_limit",
}


def _capture() -> SimpleNamespace:
    config = {key: os.environ.get(var) for var, key in CAPTURED.items() if var in os.environ}
    return SimpleNamespace(spyre_graph_cache=SimpleNamespace(deeptools_config={"config": config}))


globals()["__state"] = _capture()  # the name 2.x reads with getattr(module, "__state")
