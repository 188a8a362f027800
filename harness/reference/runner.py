"""The CPU reference (cpu-ref): transformers on the CPU, float32, greedy.

Each prompt runs alone (no padding), so the reference is the model's own
answer for that prompt and nothing else; outputs are cached on disk by
``harness.reference.cache`` and recomputed only when an input changes.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.core.comparison import NEAR_TIE_TOP_K
from harness.core.cpu_share import cpu_share, use_threads
from harness.core.serialise import request_from_dict, request_to_dict
from harness.core.trace import RequestTrace, TokenStep, Trace
from harness.reference.cache import ReferenceCache
from harness.reference.entry import reference_entry_problem

if TYPE_CHECKING:
    from harness.scenario.prompts import Scenario

NAME = "cpu-ref"


# Where each package states its ``__version__`` as a literal.
_VERSION_FILES = {"torch": "version.py", "transformers": "__init__.py"}


def package_version(name: str) -> str:
    """``name.__version__``, read from the package's source where it states it, so that a
    session whose references are all cached never imports torch or transformers (an import
    where the file says otherwise)."""
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            source = Path(list(spec.submodule_search_locations)[0]) / _VERSION_FILES[name]
            try:
                m = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", source.read_text(),
                              re.MULTILINE)
            except OSError:
                m = None
            if m:
                return m.group(1)
        module = importlib.import_module(name)
    return str(module.__version__)


def reference_stack() -> dict[str, str]:
    """What the reference outputs depend on besides model and prompt."""
    return {
        "torch": package_version("torch"),
        "transformers": package_version("transformers"),
        "impl": hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16],
    }


class ReferenceRunner:
    """Greedy decoding with transformers, one prompt at a time, cached."""

    label = NAME

    def __init__(
        self, model_path: Path, model_hash: str, cache: ReferenceCache, top_k: int = NEAR_TIE_TOP_K
    ) -> None:
        self.top_k = top_k  # top log-probabilities kept per position (the near-tie rule's k)
        self.model_path = model_path
        self.model_hash = model_hash
        self.cache = cache
        self._model: Any = None
        self._stack: dict[str, str] | None = None

    @property
    def stack(self) -> dict[str, str]:
        if self._stack is None:
            self._stack = reference_stack()
        return self._stack

    def _load(self) -> Any:
        if self._model is None:
            # deferred: a heavy import, paid only where this runs
            import torch
            from transformers import AutoModelForCausalLM

            share = cpu_share()  # its share of the cores, beside the other workers' engines
            if share is not None:
                use_threads(share)
            self._model = AutoModelForCausalLM.from_pretrained(
                str(self.model_path), torch_dtype=torch.float32
            ).eval()
        return self._model

    def greedy(
        self, prompt_token_ids: list[int], max_tokens: int, top_k: int
    ) -> list[TokenStep]:
        """Greedy continuation of one prompt with top-k log-probabilities per position."""
        # deferred: a heavy import, paid only where this runs
        import torch

        model = self._load()
        steps: list[TokenStep] = []
        with torch.inference_mode():
            out = model(torch.tensor([prompt_token_ids]), use_cache=True)
            for _ in range(max_tokens):
                logp = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
                token = int(torch.argmax(logp))
                vals, idx = torch.topk(logp, top_k)
                top = {int(i): float(v) for v, i in zip(vals, idx, strict=True)}
                top[token] = float(logp[token])
                steps.append(
                    TokenStep(
                        token_id=token, logprob=float(logp[token]), top_logprobs=top
                    )
                )
                out = model(
                    torch.tensor([[token]]),
                    past_key_values=out.past_key_values,
                    use_cache=True,
                )
        return steps

    def generate(self, scenario: Scenario) -> Trace:
        """The Runner verb: reference outputs for every request of ``scenario``."""
        return self.run(scenario.payload(), self.top_k)

    def run(self, requests: list[dict[str, Any]], top_k: int) -> Trace:
        """Reference outputs for ``requests`` (request_id, prompt_token_ids, max_tokens)."""
        trace = Trace(target=NAME)
        for r in requests:
            key_fields = {
                "model": self.model_hash,
                "prompt_token_ids": list(r["prompt_token_ids"]),
                "max_tokens": int(r["max_tokens"]),
                "top_k": int(top_k),
                "greedy": True,
                "stack": self.stack,
            }

            def compute(r: dict[str, Any] = r) -> dict[str, Any]:
                steps = self.greedy(
                    list(r["prompt_token_ids"]), int(r["max_tokens"]), top_k
                )
                rt = RequestTrace(
                    request_id="ref",
                    prompt_token_ids=list(r["prompt_token_ids"]),
                    steps=steps,
                    finish_reason="length",
                )
                return request_to_dict(rt)

            d = self.cache.get_or_compute(
                key_fields, compute,
                check=lambda v, r=r: reference_entry_problem(
                    v, list(r["prompt_token_ids"]), int(r["max_tokens"])),
            )
            rt = request_from_dict(d)
            rt.request_id = r["request_id"]
            trace.requests[r["request_id"]] = rt
        return trace
