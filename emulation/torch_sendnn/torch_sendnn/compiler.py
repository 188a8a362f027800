"""The compiler's refusal: a dynamic graph for an engine shape a card does not compile.

A continuous-batching model is compiled with ``sendnn.dynamic`` for the maxima the plugin hands
the runtime in its environment (``VLLM_DT_MAX_CONTEXT_LEN``, ``VLLM_DT_MAX_BATCH_SIZE``,
``VLLM_DT_CHUNK_LEN``), read here when the graph is compiled. The stand-in refuses what a card
is known to fail on (upstream's suite compiles every engine at a context of at least 512 and a
batch that is a power of two of at least 4), and what the runtime cannot hold (over 32K
tokens, lengths off the 64-token block). A static graph (static batching) is compiled for
one shape and is not checked. What else a real compiler refuses (memory, a block count other
than the plugin's, operator support) only a card shows.
"""

from __future__ import annotations

import os

MIN_CONTEXT, MAX_CONTEXT, BLOCK, MIN_BATCH = 512, 32768, 64, 4


class SendnnCompileError(RuntimeError):
    """The graph cannot be compiled for the card at the shape it was given."""


def _var(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise SendnnCompileError(f"{name}={value!r} is not an integer") from None


def refusals() -> list[str]:
    """What in the environment's shape the compiler refuses (empty: it compiles)."""
    out = []
    context = _var("VLLM_DT_MAX_CONTEXT_LEN")
    if context is not None and not (MIN_CONTEXT <= context <= MAX_CONTEXT and context % BLOCK == 0):
        out.append(f"VLLM_DT_MAX_CONTEXT_LEN={context}: the context must be {MIN_CONTEXT} to"
                   f" {MAX_CONTEXT} tokens, a multiple of {BLOCK}")
    batch = _var("VLLM_DT_MAX_BATCH_SIZE")
    if batch is not None and (batch < MIN_BATCH or batch & (batch - 1)):
        out.append(f"VLLM_DT_MAX_BATCH_SIZE={batch}: the batch must be a power of two, at least"
                   f" {MIN_BATCH}")
    chunk = _var("VLLM_DT_CHUNK_LEN")
    if chunk is not None and (chunk <= 0 or chunk % BLOCK):
        out.append(f"VLLM_DT_CHUNK_LEN={chunk}: the prefill chunk must be a multiple of {BLOCK}")
    return out


def check_dynamic_shape(options: dict[str, object]) -> None:
    """Refuse a dynamic graph whose shape the card does not compile."""
    if not options.get("sendnn.dynamic"):
        return
    problems = refusals()
    if problems:
        raise SendnnCompileError("torch_sendnn: compilation failed, unsupported shape: "
                                 + "; ".join(problems))
