"""The Trace: what one target did with one scenario, as plain data.

Every target returns this type, so every check works on every target. Traces
are JSON-serialisable (``to_dict``/``from_dict``) because engines run in their
own processes and references are cached on disk as JSON.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class TokenStep:
    """One generated position: the chosen token and the top-k alternatives.

    ``top_logprobs`` maps token id -> log-probability over the full vocabulary
    (raw model distribution, before sampling); it always contains ``token_id``.
    """

    token_id: int
    logprob: float
    top_logprobs: dict[int, float]

    def prob_of(self, token_id: int) -> float | None:
        """Probability of ``token_id`` at this position, if it is in the top-k."""
        lp = self.top_logprobs.get(token_id)
        return None if lp is None else math.exp(lp)

    def rank_of(self, token_id: int) -> int | None:
        """1-based rank of ``token_id`` among the top-k, or None if absent."""
        if token_id not in self.top_logprobs:
            return None
        ranked = sorted(self.top_logprobs.items(), key=lambda kv: (-kv[1], kv[0]))
        return 1 + [t for t, _ in ranked].index(token_id)


@dataclass
class RequestTrace:
    """Everything observed about one request."""

    request_id: str
    prompt_token_ids: list[int]
    steps: list[TokenStep] = field(default_factory=list)
    num_preemptions: int = 0
    finish_reason: str | None = None

    @property
    def token_ids(self) -> list[int]:
        return [s.token_id for s in self.steps]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        # JSON object keys must be strings.
        d["steps"] = [
            {
                "token_id": s.token_id,
                "logprob": s.logprob,
                "top_logprobs": {str(k): v for k, v in s.top_logprobs.items()},
            }
            for s in self.steps
        ]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RequestTrace:
        steps = [
            TokenStep(
                token_id=int(s["token_id"]),
                logprob=float(s["logprob"]),
                top_logprobs={int(k): float(v) for k, v in s["top_logprobs"].items()},
            )
            for s in d["steps"]
        ]
        return cls(
            request_id=d["request_id"],
            prompt_token_ids=list(d["prompt_token_ids"]),
            steps=steps,
            num_preemptions=int(d.get("num_preemptions", 0)),
            finish_reason=d.get("finish_reason"),
        )


@dataclass
class Trace:
    """The outcome of running one scenario on one target.

    ``engine_steps`` holds per-step scheduler and KV snapshots (plain dicts, see
    ``harness.checks.ledger``) when the scenario was step-driven; ``metrics`` holds engine
    counters such as ``vllm:num_preemptions``.
    """

    target: str
    requests: dict[str, RequestTrace] = field(default_factory=dict)
    engine_steps: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "requests": {k: v.to_dict() for k, v in self.requests.items()},
            "engine_steps": self.engine_steps,
            "metrics": self.metrics,
            "info": self.info,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trace:
        return cls(
            target=d["target"],
            requests={k: RequestTrace.from_dict(v) for k, v in d["requests"].items()},
            engine_steps=list(d.get("engine_steps", [])),
            metrics=dict(d.get("metrics", {})),
            info=dict(d.get("info", {})),
        )
