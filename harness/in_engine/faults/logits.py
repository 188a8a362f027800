"""Faults in the numbers the model hands to vLLM's sampler: its logits, as a kernel error would.

One wrong token far from a near-tie, every logit scaled (tokens equal, logprobs off), a
device that wanders off a few tokens after an honest near-tie, and a greedy sampler that takes
the runner-up where the top two are close (its own logprobs left true).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.in_engine.fault_registry import Once, armed, fault


def _patch_logits(perturb: Callable[[Any], Any]) -> None:
    """Route the logits every engine step hands to vLLM's sampler through ``perturb`` (after
    start-up), before the sampler computes the logprobs it reports: as a kernel error would."""
    from vllm.v1.sample.sampler import Sampler  # defers a heavy import

    original = Sampler.forward

    def forward(self: Any, logits: Any, sampling_metadata: Any, *a: Any, **kw: Any) -> Any:
        if armed():
            logits = perturb(logits)
        return original(self, logits, sampling_metadata, *a, **kw)

    Sampler.forward = forward  # type: ignore[method-assign]


@fault("perturb-logit")
def perturb_logit(config: dict[str, Any], position: str = "5", row: str = "0") -> None:
    """Once, at the ``position``-th sampling step after the engine started, make the
    least likely token the argmax in batch row ``row``: one wrong token, far from a
    near-tie. For a request running alone, that step is its generated position."""
    import torch  # defers a heavy import

    pos, r = int(position), int(row)
    once = Once(after=pos)  # counts the steps whose batch has row ``r``

    def perturb(logits: torch.Tensor) -> torch.Tensor:
        if logits.shape[0] <= r or not once.due():
            return logits
        logits = logits.clone()
        worst = int(torch.argmin(logits[r]))
        logits[r, worst] = logits[r].max() + 20.0
        once.fire(f"[hil] fault perturb_logit fired: row {r}, position {pos}, token {worst}")
        return logits

    _patch_logits(perturb)


@fault("kernel-drift")
def kernel_drift(config: dict[str, Any], rel: str = "0.03") -> None:
    """A small numerics error in a kernel: the final RMSNorm's gain is off by ``rel`` (relative),
    so every logit (the LM head is linear, without bias) is scaled by ``1 + rel``. The argmax
    never changes, so greedy tokens stay equal at every position; the logprobs move."""
    eps = float(rel)
    said = Once()  # the damage is done at every step; the log line is printed once

    def perturb(logits: Any) -> Any:
        if said.due():
            said.fire(f"[hil] fault kernel_drift fired: logits scaled by {1 + eps:g}")
        return logits * (1 + eps)

    _patch_logits(perturb)


@fault("drift-after-near-tie")
def drift_after_near_tie(config: dict[str, Any], after: str = "3", tol: str = "0.05") -> None:
    """A device that wanders off a few tokens after an honest near-tie: at the first decode step
    of an engine call where a batch row's own top-2 probabilities are within ``tol``, that row
    takes the runner-up (the swap a near-tie allows); ``after`` steps later, the same row's least
    likely token becomes its argmax. Rows of a batch keep their slot while every request decodes
    (equal lengths), so the row is the same request. Re-armed at each ``LLM.generate`` call, so a
    teacher-forced run of the same requests meets the same error (its own state machine, not a
    ``Once``: it fires twice per call)."""
    import torch  # defers a heavy import
    from vllm import LLM  # defers a heavy import

    n_after, gap_tol = int(after), float(tol)
    state: dict[str, Any] = {"row": None, "calls": 0, "rows": 0, "done": False}
    original_generate = LLM.generate

    def generate(self: Any, *a: Any, **kw: Any) -> Any:
        state.update(row=None, calls=0, rows=0, done=False)
        return original_generate(self, *a, **kw)

    LLM.generate = generate  # type: ignore[method-assign]

    def perturb(logits: torch.Tensor) -> torch.Tensor:
        state["calls"] += 1
        if state["done"]:
            return logits
        if state["row"] is None:
            if state["calls"] < 2:  # the prefill's first token: rows are not decode slots yet
                return logits
            probs = torch.softmax(logits.float(), dim=-1)
            top = torch.topk(probs, 2, dim=-1)
            gaps = top.values[:, 0] - top.values[:, 1]
            rows = torch.nonzero(gaps <= gap_tol).flatten().tolist()
            if not rows:
                return logits
            r = int(rows[0])
            logits = logits.clone()
            a_id, b_id = int(top.indices[r, 0]), int(top.indices[r, 1])
            logits[r, a_id], logits[r, b_id] = logits[r, b_id].clone(), logits[r, a_id].clone()
            state.update(row=r, rows=logits.shape[0], fired_at=state["calls"])
            print(f"[hil] fault drift_after_near_tie: near-tie swap in row {r}"
                  f" (gap {float(gaps[r]):.4f}), tokens {a_id}<->{b_id}", flush=True)
            return logits
        if state["calls"] == state["fired_at"] + n_after and logits.shape[0] == state["rows"]:
            r = state["row"]
            logits = logits.clone()
            worst = int(torch.argmin(logits[r]))
            logits[r, worst] = logits[r].max() + 20.0
            state["done"] = True
            print(f"[hil] fault drift_after_near_tie fired: row {r}, {n_after} steps after the"
                  f" near-tie, token {worst}", flush=True)
        return logits

    _patch_logits(perturb)


@fault("runner-up-when-close")
def runner_up_when_close(config: dict[str, Any], tol: str = "0.5") -> None:
    """A greedy sampler that does not take the maximum: wherever a batch row's top two logits
    are within ``tol`` (nats; for a greedy row the logit gap is the logprob gap), vLLM's greedy
    argmax (``Sampler.greedy_sample``) returns the runner-up. The logprobs vLLM returns are
    computed beside it from the same logits, so they stay the true ones: the sampled token's own
    logprob and rank say it is second. At every such step, not once; rows whose runner-up is
    masked (a teacher-forced row) keep their token."""
    import torch  # defers a heavy import
    from vllm.v1.sample.sampler import Sampler  # defers a heavy import

    gap_tol = float(tol)
    original = Sampler.greedy_sample  # a staticmethod: the plain function
    said = Once()  # the damage is done at every close step; the log line is printed once

    def greedy_sample(logits: torch.Tensor) -> torch.Tensor:
        sampled = original(logits)
        if not armed() or logits.dim() != 2 or logits.shape[-1] < 2:
            return sampled
        top = torch.topk(logits, 2, dim=-1)
        close = (top.values[:, 0] - top.values[:, 1]) <= gap_tol  # False for NaN and -inf gaps
        if not bool(close.any()):
            return sampled
        if said.due():
            r = int(torch.nonzero(close).flatten()[0])
            said.fire(f"[hil] fault runner_up_when_close fired: row {r} took token"
                      f" {int(top.indices[r, 1])} over {int(top.indices[r, 0])} (gap"
                      f" {float(top.values[r, 0] - top.values[r, 1]):.4f} <= {gap_tol:g})")
        return torch.where(close, top.indices[:, 1].to(sampled.dtype), sampled)

    Sampler.greedy_sample = staticmethod(greedy_sample)  # type: ignore[method-assign]
