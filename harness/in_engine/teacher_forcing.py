"""Teacher forcing inside the engine process: the device is fed the reference's tokens.

One mechanism for every vLLM V1 target: ``TeacherForcing``, a vLLM V1 logits
processor installed in every engine the harness starts (``LLM(logits_processors=
[...])``; vllm-spyre's static and continuous-batching runners build the same
custom processors). A request whose ``SamplingParams.extra_args`` carries
``EXTRA_ARG`` (the reference's token ids) gets, at each decode position, every
logit but the reference's token masked, so the engine samples the reference's
token and conditions the next position on it. It runs in the real decode path:
the forced requests are batched, use the paged KV cache and join and leave the
batch as any other.

vLLM's sampler computes the logprobs it returns from the raw logits *before*
any logits processor runs (``logprobs_mode="raw_logprobs"``, the default), so
the recorded top-k, and the forced token's own logprob and rank, are the
device's distribution, untouched by the forcing. Requests without the extra
argument are not touched.

Imported only in the engine process (it imports vLLM).
"""

from __future__ import annotations

from typing import Any

from harness.core.trace import RequestTrace, TokenStep

EXTRA_ARG = "hil_teacher_tokens"


def unsupported_reason() -> str | None:
    """Why this engine's vLLM cannot run teacher-forced requests (None: it can)."""
    try:
        # deferred: a heavy import, paid only where this runs
        from vllm.v1.sample.logits_processor import LogitsProcessor  # noqa: F401
    except ImportError as e:
        # deferred: a heavy import, paid only where this runs
        import vllm

        return (f"teacher forcing needs vLLM V1 custom logits processors"
                f" (vllm.v1.sample.logits_processor.LogitsProcessor, vLLM >= 0.10.2);"
                f" this engine runs vLLM {vllm.__version__} ({e})")
    return None


def processor_class() -> type:
    """The ``TeacherForcing`` logits processor class (built on first use: imports vLLM)."""
    global _CLASS
    if _CLASS is None:
        _CLASS = _build_class()
    return _CLASS


_CLASS: type | None = None


def _build_class() -> type:
    # deferred: a heavy import, paid only where this runs
    import torch
    from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
    from vllm.v1.sample.logits_processor.builtin import process_dict_updates

    class TeacherForcing(LogitsProcessor):
        """Masks all logits but the reference's token of each forced request."""

        def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
            # batch index -> (reference tokens, the request's live output token list)
            self.forced: dict[int, tuple[list[int], list[int]]] = {}

        def is_argmax_invariant(self) -> bool:
            return False  # it changes the greedy token: must run for temperature 0 too

        @staticmethod
        def _state(params: Any, _prompt: Any, output_ids: list[int]) -> Any:
            extra = getattr(params, "extra_args", None) or {}
            tokens = extra.get(EXTRA_ARG)
            return None if tokens is None else ([int(t) for t in tokens], output_ids)

        def update_state(self, batch_update: BatchUpdate | None) -> None:
            process_dict_updates(self.forced, batch_update, self._state)

        def apply(self, logits: torch.Tensor) -> torch.Tensor:
            for index, (tokens, output_ids) in self.forced.items():
                pos = len(output_ids)  # the position being sampled now
                if index < logits.shape[0] and pos < len(tokens):
                    row = logits[index]
                    keep = row[tokens[pos]].clone()
                    row.fill_(float("-inf"))
                    row[tokens[pos]] = keep if torch.isfinite(keep) else 0.0
            return logits

    # Named as a module attribute (``__getattr__`` below): pickled by reference into the ranks
    # of a tensor-parallel engine, each of which builds it in its own process.
    TeacherForcing.__qualname__ = "TeacherForcing"
    return TeacherForcing


def __getattr__(name: str) -> Any:
    """``TeacherForcing``, the module attribute a pickled reference to the class names."""
    if name == "TeacherForcing":
        return processor_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def install(llm_kwargs: dict[str, Any]) -> str | None:
    """Add the processor to the engine's arguments; the reason when it cannot be."""
    reason = unsupported_reason()
    if reason is None:
        llm_kwargs["logits_processors"] = [*(llm_kwargs.get("logits_processors") or []),
                                           processor_class()]
    return reason


def forced_request_trace(request_id: str, out: Any, prompt: list[int]) -> Any:
    """A forced request's output as a RequestTrace: each step's token is the forced one,
    its logprob and rank the device's own, ``top_logprobs`` the device's top-k."""
    comp = out.outputs[0]
    steps = []
    for pos, tid in enumerate(comp.token_ids):
        lp_map = comp.logprobs[pos] if comp.logprobs else {}
        top = {int(t): float(lp.logprob) for t, lp in lp_map.items()}
        own = lp_map.get(int(tid))
        rank = None if own is None or own.rank is None else int(own.rank)
        steps.append(TokenStep(int(tid), top.get(int(tid), float("nan")), top, rank))
    return RequestTrace(request_id=request_id, prompt_token_ids=list(out.prompt_token_ids or prompt),
                        steps=steps, finish_reason=comp.finish_reason)
