"""Measure reduced-precision noise: the model in fp16 or bf16 against itself in fp32, on the CPU.

The sequences are the suites' prompts (every prompt of every prompt set in
fixtures/prompts, once each) continued by the fp32 reference's greedy tokens (the
reference runner's own output, from its cache when present), so the positions measured
are the ones the suites compare. Each sequence runs once per precision, one forward pass
over the prompt and the continuation (teacher-forced), and every generated position is
measured (``harness.calibration.metrics``).

``attn_scale`` multiplies the attention score scale of every layer of the reduced-precision
model: a fault the size of a kernel bug (an 8 % error is 1.08), to show what the thresholds
let through. Calibration itself always runs with 1.0.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.calibration.metrics import METRICS, position_metrics
from harness.core.comparison import NEAR_TIE_TOP_K
from harness.core.paths import FIXTURES
from harness.reference.cache import ReferenceCache
from harness.reference.runner import ReferenceRunner
from harness.scenario.prompts import PromptSet
from harness.scenario.token_cache import CachedTokenizer

PRECISIONS = ("fp16", "bf16")


def torch_dtype(precision: str) -> Any:
    """The torch dtype of a precision name; ValueError naming the known ones."""
    # deferred: a heavy import, paid only where this runs
    import torch

    dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
    if precision not in dtypes:
        raise ValueError(f"unknown precision {precision!r}; known: {', '.join(PRECISIONS)}")
    return dtypes[precision]


@dataclass(frozen=True)
class Sequence:
    """One prompt of a prompt set: its token ids and how many tokens the suites generate."""

    name: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int


def suite_sequences(tokenizer: Any, prompt_dir: Path | None = None) -> list[Sequence]:
    """Every prompt of every prompt set, once (the first occurrence of equal token ids and
    length), cut to fit its set's ``max_model_len``."""
    out: list[Sequence] = []
    seen: set[tuple[tuple[int, ...], int]] = set()
    for path in sorted((prompt_dir or FIXTURES / "prompts").glob("*.json")):
        ps = PromptSet.load(path)
        for pid, p in ps.prompts.items():
            ids = tuple(ps.prompt_ids(pid, tokenizer))
            n = min(int(p.get("max_tokens", ps.max_tokens)), ps.limits.max_model_len - len(ids))
            if n < 1 or (ids, n) in seen:
                continue
            seen.add((ids, n))
            out.append(Sequence(f"{ps.name}/{pid}", ids, n))
    return out


@dataclass
class Measurement:
    """Per-position values of every metric over all sequences, in sequence order."""

    precision: str
    values: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in METRICS})
    flips: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)  # positions per sequence, in order
    seconds: float = 0.0
    # Positions where the fp32 teacher-forced argmax is not the reference's cached token
    # (summation order of a full pass against incremental decoding): expected 0.
    reference_disagreements: int = 0

    @property
    def positions(self) -> int:
        return len(self.flips)

    @property
    def sequences(self) -> int:
        return len(self.lengths)


def load_model(model_path: Path, precision: str) -> Any:
    """The model in ``precision`` (``fp32`` too), for inference."""
    # deferred: a heavy import, paid only where this runs
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        str(model_path), dtype=torch_dtype(precision)).eval()


def scale_attention(model: Any, factor: float) -> int:
    """Multiply every attention layer's score scale by ``factor``; returns how many changed."""
    changed = 0
    for module in model.modules():
        if hasattr(module, "q_proj") and isinstance(getattr(module, "scaling", None), float):
            module.scaling *= factor
            changed += 1
    if factor != 1.0 and not changed:
        raise ValueError(f"{type(model).__name__} has no attention module with a float"
                         " 'scaling' to change")
    return changed


def reference_tokens(model_path: Path, model_hash: str, sequences: list[Sequence],
                     cache_dir: Path) -> list[list[int]]:
    """The fp32 reference's greedy continuation of each sequence (the suites' reference cache)."""
    runner = ReferenceRunner(model_path, model_hash, ReferenceCache(cache_dir / "reference"))
    requests = [{"request_id": str(i), "prompt_token_ids": list(s.prompt_token_ids),
                 "max_tokens": s.max_tokens} for i, s in enumerate(sequences)]
    trace = runner.run(requests, NEAR_TIE_TOP_K)
    return [trace.requests[str(i)].token_ids for i in range(len(sequences))]


def measure(model_path: Path, model_hash: str, precision: str, cache_dir: Path,
            sequences: list[Sequence] | None = None, attn_scale: float = 1.0) -> Measurement:
    """Run every sequence in fp32 and in ``precision`` and measure every generated position."""
    # deferred: a heavy import, paid only where this runs
    import torch

    start = time.monotonic()
    if sequences is None:
        sequences = suite_sequences(CachedTokenizer(model_path, model_hash, cache_dir))
    continuations = reference_tokens(model_path, model_hash, sequences, cache_dir)
    full = load_model(model_path, "fp32")
    half = load_model(model_path, precision)
    scale_attention(half, attn_scale)
    out = Measurement(precision)
    with torch.inference_mode():
        for seq, cont in zip(sequences, continuations, strict=True):
            ids = torch.tensor([list(seq.prompt_token_ids) + cont[:-1]])
            first = len(seq.prompt_token_ids) - 1
            lf = full(ids).logits[0, first:]
            lh = half(ids).logits[0, first:]
            got = position_metrics(lf, lh, cont)
            for name in METRICS:
                out.values[name].extend(got[name])
            out.flips.extend(got["flip"])
            out.reference_disagreements += int((lf.argmax(-1) != torch.tensor(cont)).sum())
            out.lengths.append(len(cont))
    out.seconds = time.monotonic() - start
    return out
