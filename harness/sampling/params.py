"""A request's sampling parameters as the harness sends them (``SamplingSpec``).

Validation refuses what vLLM 0.28 refuses (``SamplingParams._verify_args``,
``_validate_logit_bias``, ``_validate_allowed_token_ids`` in ``vllm/sampling_params.py``), naming
the parameter and its range, so a bad scenario fails before any engine starts.
vLLM is not imported: the harness's core does not depend on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

# vllm/sampling_params.py: a temperature below _SAMPLING_EPS is greedy, and a positive temperature
# below _MAX_TEMP is raised to _MAX_TEMP by SamplingParams.__post_init__ (so only 0 is greedy).
SAMPLING_EPS = 1e-5
MIN_POSITIVE_TEMPERATURE = 1e-2


class SamplingParamsError(ValueError):
    """A sampling parameter vLLM would refuse; the message names the parameter and its range."""


@dataclass(frozen=True)
class SamplingSpec:
    """One request's sampling parameters (immutable; defaults are vLLM's, except greedy).

    ``bad_words`` are the token-id sequences vLLM bans (what
    ``SamplingParams.update_from_tokenizer`` derives from the words: see ``bad_words_token_ids``);
    ``bad_words_text`` are the words sent.
    ``eos_token_ids`` are the model's end-of-sequence ids (the engine adds them, they are not sent):
    with ``stop_token_ids`` they are what ``min_tokens`` suppresses.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    bad_words: tuple[tuple[int, ...], ...] = ()
    bad_words_text: tuple[str, ...] = ()
    allowed_token_ids: tuple[int, ...] | None = None
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    eos_token_ids: tuple[int, ...] = field(default=())
    seed: int | None = None

    def __post_init__(self) -> None:
        for problem in _problems(self):
            raise SamplingParamsError(problem)

    @property
    def effective_temperature(self) -> float:
        """The temperature vLLM samples with: 0 stays 0 (greedy), (0, 0.01) becomes 0.01."""
        if self.temperature == 0.0:
            return 0.0
        return max(self.temperature, MIN_POSITIVE_TEMPERATURE)

    @property
    def is_greedy(self) -> bool:
        """True iff vLLM takes the argmax (``SamplingType.GREEDY``): top-k, top-p, min-p unused."""
        return self.effective_temperature < SAMPLING_EPS

    @property
    def is_seeded(self) -> bool:
        """True iff vLLM gives the request its own generator (``SamplingType.RANDOM_SEED``)."""
        return not self.is_greedy and self.seed is not None and self.seed != -1

    @property
    def suppressed_until_min_tokens(self) -> frozenset[int]:
        """The ids ``min_tokens`` bans (vLLM's ``all_stop_token_ids``: stop ids and EOS ids)."""
        return frozenset(self.stop_token_ids) | frozenset(self.eos_token_ids)

    def bias_by_token(self) -> dict[int, float]:
        """``logit_bias`` as vLLM's dict (the last entry for a token wins, as in a dict)."""
        return dict(self.logit_bias)

    def check_vocab(self, vocab_size: int) -> None:
        """Refuse token ids outside ``[0, vocab_size)`` (vLLM refuses them on arrival)."""
        for name, ids in (
            ("logit_bias", [t for t, _ in self.logit_bias]),
            ("allowed_token_ids", list(self.allowed_token_ids or ())),
            ("bad_words", [t for word in self.bad_words for t in word]),
            ("stop_token_ids", list(self.stop_token_ids)),
            ("eos_token_ids", list(self.eos_token_ids)),
        ):
            outside = sorted({t for t in ids if not 0 <= t < vocab_size})
            if outside:
                raise SamplingParamsError(
                    f"{name}: token ids {outside} are outside the vocabulary [0, {vocab_size})"
                )

    def to_vllm_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``vllm.SamplingParams`` (only what differs from its defaults,
        plus ``temperature`` and ``max_tokens``, which the harness always states)."""
        kwargs: dict[str, Any] = {"temperature": self.temperature, "max_tokens": self.max_tokens}
        defaults: dict[str, Any] = {
            "top_k": 0,
            "top_p": 1.0,
            "min_p": 0.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "repetition_penalty": 1.0,
            "min_tokens": 0,
            "seed": None,
        }
        for name, default in defaults.items():
            value = getattr(self, name)
            if value != default:
                kwargs[name] = value
        if self.logit_bias:
            kwargs["logit_bias"] = self.bias_by_token()
        if self.bad_words_text:
            kwargs["bad_words"] = list(self.bad_words_text)
        if self.allowed_token_ids is not None:
            kwargs["allowed_token_ids"] = list(self.allowed_token_ids)
        if self.stop_token_ids:
            kwargs["stop_token_ids"] = list(self.stop_token_ids)
        return kwargs


def _problems(spec: SamplingSpec) -> list[str]:
    """What vLLM would refuse in ``spec``, in ``_verify_args``'s order (empty if nothing)."""
    problems = []
    if not -2.0 <= spec.presence_penalty <= 2.0:
        problems.append(f"presence_penalty must be in [-2, 2], got {spec.presence_penalty}")
    if not -2.0 <= spec.frequency_penalty <= 2.0:
        problems.append(f"frequency_penalty must be in [-2, 2], got {spec.frequency_penalty}")
    if not (math.isfinite(spec.repetition_penalty) and spec.repetition_penalty > 0.0):
        problems.append(
            f"repetition_penalty must be a finite number > 0, got {spec.repetition_penalty}"
        )
    if not (math.isfinite(spec.temperature) and 0.0 <= spec.temperature <= 2.0):
        problems.append(f"temperature must be in [0, 2], got {spec.temperature}")
    if not 0.0 < spec.top_p <= 1.0:
        problems.append(f"top_p must be in (0, 1], got {spec.top_p}")
    if not isinstance(spec.top_k, int) or spec.top_k < -1:
        problems.append(f"top_k must be 0 or -1 (off) or an integer >= 1, got {spec.top_k!r}")
    if not 0.0 <= spec.min_p <= 1.0:
        problems.append(f"min_p must be in [0, 1], got {spec.min_p}")
    if spec.max_tokens < 1:
        problems.append(f"max_tokens must be at least 1, got {spec.max_tokens}")
    if spec.min_tokens < 0:
        problems.append(f"min_tokens must be >= 0, got {spec.min_tokens}")
    elif spec.min_tokens > spec.max_tokens:
        problems.append(
            f"min_tokens must be <= max_tokens={spec.max_tokens}, got {spec.min_tokens}"
        )
    if any(not word for word in spec.bad_words_text):
        problems.append("bad_words_text cannot contain an empty string")
    if any(not word for word in spec.bad_words):
        problems.append("bad_words cannot contain an empty token sequence")
    if spec.allowed_token_ids is not None and not spec.allowed_token_ids:
        problems.append("allowed_token_ids must not be empty (leave it None for no restriction)")
    return problems


def bad_words_token_ids(encode: Any, words: list[str]) -> tuple[tuple[int, ...], ...]:
    """The token sequences vLLM 0.28 bans for ``words`` (``SamplingParams.update_from_tokenizer``):
    each word as given (left-stripped), and with a leading space when that starts with another
    token and has the same length. ``encode(text)`` returns token ids without special tokens."""
    sequences: list[tuple[int, ...]] = []
    for word in words:
        plain = tuple(encode(word.lstrip()))
        sequences.append(plain)
        spaced = tuple(encode(" " + word.lstrip()))
        if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
            sequences.append(spaced)
    return tuple(sequences)
