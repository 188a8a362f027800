"""Token comparison records: the near-tie policy, and what comparing a device's tokens with the
reference's found per request and per trace (the checks in ``harness.checks.tokens`` make them;
``harness.render.token_diff`` prints them)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

# The near-tie rule's defaults (--near-tie-topk, --near-tie-tol).
NEAR_TIE_TOP_K = 5
NEAR_TIE_PROB_TOL = 0.05


@dataclass(frozen=True)
class NearTiePolicy:
    """When a first divergence is accepted as a near-tie (see module docstring)."""

    top_k: int = NEAR_TIE_TOP_K
    prob_tol: float = NEAR_TIE_PROB_TOL
    dtypes: str = ""  # e.g. "reference fp32, device fp16": stated in every diff
    source: str = ""  # where prob_tol came from when it is not the default (a calibration)

    def __post_init__(self) -> None:
        if self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if not 0.0 <= self.prob_tol <= 1.0:
            raise ValueError(f"prob_tol must be in [0, 1], got {self.prob_tol}")

    def describe(self) -> str:
        """The policy values as shown in reports."""
        text = f"top_k={self.top_k}, prob_tol={self.prob_tol:.4g}"
        text = f"{text}, {self.dtypes}" if self.dtypes else text
        return f"{text}; prob_tol {self.source}" if self.source else text


class TokenOutcome(Enum):
    """Outcome of comparing one request's tokens (a check's result is a ``Verdict``)."""

    EXACT = "exact"
    NEAR_TIE = "near-tie"
    MISMATCH = "mismatch"
    LENGTH_MISMATCH = "length mismatch"
    MISSING = "missing"
    PROMPT_MISMATCH = "prompt mismatch"


def _exp(logprob: float | None) -> float | None:
    return None if logprob is None else math.exp(logprob)


@dataclass
class TokenDiff:
    """The comparison of one request's generated tokens.

    ``position`` is the first output position that differs (for
    ``LENGTH_MISMATCH``: the first position only one side produced); it is None
    for ``EXACT``, ``MISSING`` and ``PROMPT_MISMATCH``. Token fields describe
    that position; a logprob or rank is None when the token is not among the
    recorded ``top_logprobs`` of that side (or that side has no token there).
    ``preceding_token_ids`` are the generated tokens before ``position``,
    identical on both sides.
    """

    request_id: str
    outcome: TokenOutcome
    position: int | None = None
    num_compared: int = 0
    ref_token_id: int | None = None
    dev_token_id: int | None = None
    # Each token's log-probability in its own side's distribution.
    ref_logprob: float | None = None
    dev_logprob: float | None = None
    # Each token's log-probability and rank in the other side's distribution.
    ref_logprob_in_dev: float | None = None
    dev_logprob_in_ref: float | None = None
    ref_rank_in_dev: int | None = None
    dev_rank_in_ref: int | None = None
    # How many alternatives each side recorded at ``position``.
    ref_top_n: int = 0
    dev_top_n: int = 0
    preceding_token_ids: list[int] = field(default_factory=list)
    prompt_token_ids: list[int] = field(default_factory=list)
    ref_num_tokens: int = 0
    dev_num_tokens: int | None = None
    ref_finish_reason: str | None = None
    dev_finish_reason: str | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        """True iff the device output is accepted (exact or near-tie)."""
        return self.outcome in (TokenOutcome.EXACT, TokenOutcome.NEAR_TIE)

    @property
    def ref_prob(self) -> float | None:
        """p_ref(ref token)."""
        return _exp(self.ref_logprob)

    @property
    def dev_prob(self) -> float | None:
        """p_dev(dev token)."""
        return _exp(self.dev_logprob)

    @property
    def ref_prob_in_dev(self) -> float | None:
        """p_dev(ref token)."""
        return _exp(self.ref_logprob_in_dev)

    @property
    def dev_prob_in_ref(self) -> float | None:
        """p_ref(dev token)."""
        return _exp(self.dev_logprob_in_ref)

    @property
    def ref_gap(self) -> float | None:
        """|p_ref(ref token) - p_ref(dev token)|, when both are known."""
        a, b = self.ref_prob, self.dev_prob_in_ref
        return None if a is None or b is None else abs(a - b)

    @property
    def dev_gap(self) -> float | None:
        """|p_dev(dev token) - p_dev(ref token)|, when both are known."""
        a, b = self.dev_prob, self.ref_prob_in_dev
        return None if a is None or b is None else abs(a - b)



def _plural(n: int, word: str) -> str:
    return f"{n} {word if n == 1 else word + 's'}"


@dataclass
class TraceComparison:
    """All per-request comparisons of a device trace against a reference trace.

    ``diffs`` follow the reference's request order. ``extra_request_ids`` are
    requests only the device produced; they are reported but do not fail.
    """

    ref_target: str
    dev_target: str
    policy: NearTiePolicy
    diffs: list[TokenDiff]
    extra_request_ids: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True iff every reference request is exact or a near-tie."""
        return all(d.ok for d in self.diffs)

    @property
    def near_ties(self) -> list[TokenDiff]:
        """Requests accepted only as near-ties."""
        return [d for d in self.diffs if d.outcome is TokenOutcome.NEAR_TIE]

    @property
    def failures(self) -> list[TokenDiff]:
        """Requests that are neither exact nor near-ties."""
        return [d for d in self.diffs if not d.ok]

    def summary(self) -> str:
        """One line, e.g. ``12 requests: 11 exact, 1 near-tie, 0 mismatched``."""
        exact = sum(d.outcome is TokenOutcome.EXACT for d in self.diffs)
        line = (
            f"{_plural(len(self.diffs), 'request')}: {exact} exact, "
            f"{_plural(len(self.near_ties), 'near-tie')}, "
            f"{len(self.failures)} mismatched"
        )
        kinds = [
            (TokenOutcome.MISMATCH, "token"),
            (TokenOutcome.LENGTH_MISMATCH, "length"),
            (TokenOutcome.MISSING, "missing"),
            (TokenOutcome.PROMPT_MISMATCH, "prompt"),
        ]
        counts = [(sum(d.outcome is v for d in self.diffs), name) for v, name in kinds]
        if any(n and name != "token" for n, name in counts):
            line += " (" + ", ".join(f"{n} {name}" for n, name in counts if n) + ")"
        return line
