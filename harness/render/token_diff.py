"""Token comparison as text: what a reader of a red token-equality test sees.

Failure blocks start with ``token mismatch:`` and near-tie blocks with
``near-tie accepted:``; each names the request, the position, both tokens with
their logprobs and ranks in the other side's distribution, the probability
gaps against the near-tie tolerance, and the tokens before the divergence.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from harness.core.comparison import TokenDiff, TokenOutcome, TraceComparison

# How many tokens before the divergence a report shows.
CONTEXT_TOKENS = 8
# How many characters of prompt text a report shows.
PROMPT_CHARS = 120


def _exp(logprob: float | None) -> float | None:
    return None if logprob is None else math.exp(logprob)


def _fmt_p(p: float | None) -> str:
    if p is None:
        return "?"
    return f"{p:.4f}" if p == 0 or p >= 1e-4 else f"{p:.2e}"


def _fmt_lp(lp: float | None) -> str:
    return "?" if lp is None else f"{lp:.4f}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word if n == 1 else word + 's'}"



def render_comparison(
    comparison: TraceComparison,
    decode: Callable[[list[int]], str] | None = None,
    prompts: dict[str, str] | None = None,
) -> str:
    """Multi-line text: one block per failure, then per near-tie, then the summary.

    ``decode`` turns token ids into text and ``prompts`` maps request id to prompt
    text; without them the text shows token ids only.
    """
    return TokenDiffText(comparison, decode, prompts).text()


class TokenDiffText:
    """Renders one comparison, with an optional decoder and prompt texts."""

    def __init__(
        self,
        comparison: TraceComparison,
        decode: Callable[[list[int]], str] | None = None,
        prompts: dict[str, str] | None = None,
    ) -> None:
        self.cmp = comparison
        self.decode = decode
        self.prompts = prompts

    def text(self) -> str:
        """Multi-line text: one block per failure, then per near-tie, then the summary.

        Failure blocks start with ``token mismatch:`` and near-tie blocks with
        ``near-tie accepted:``, so the first line categorises the whole report.
        """
        blocks = [self._render(d) for d in self.cmp.failures]
        blocks += [self._render(d) for d in self.cmp.near_ties]
        if self.cmp.extra_request_ids:
            blocks.append(
                f"device {self.cmp.dev_target} returned requests absent from the "
                f"reference: {', '.join(map(repr, self.cmp.extra_request_ids))}"
            )
        blocks.append(
            f"{self.cmp.dev_target} vs {self.cmp.ref_target} reference: {self.cmp.summary()}"
        )
        return "\n".join(blocks)

    def _text(self, ids: list[int]) -> str:
        """`` <repr of decoded text>`` with a leading space, or "" without a decoder."""
        if self.decode is None:
            return ""
        # A broken decoder must not hide the failure being reported.
        try:
            return " " + repr(self.decode(ids))
        except Exception as exc:  # noqa: BLE001
            return f" <decode failed: {exc!r}>"

    def _prompt_line(self, d: TokenDiff) -> str:
        n = len(d.prompt_token_ids)
        text: str | None = None
        if self.prompts is not None and d.request_id in self.prompts:
            text = self.prompts[d.request_id]
        elif self.decode is not None and d.prompt_token_ids:
            # Fall back to ids rather than lose the report to a broken decoder.
            try:
                text = self.decode(d.prompt_token_ids)
            except Exception:  # noqa: BLE001
                text = None
        if text is None:
            head = d.prompt_token_ids[:16]
            more = " ..." if n > len(head) else ""
            return f"  prompt ({_plural(n, 'token')}): ids {head}{more}"
        shown = repr(text[:PROMPT_CHARS]) + (" ..." if len(text) > PROMPT_CHARS else "")
        return f"  prompt ({_plural(n, 'token')}): {shown}"

    def _token_line(
        self,
        label: str,
        token: int | None,
        logprob: float | None,
        other: str,
        rank_in_other: int | None,
        logprob_in_other: float | None,
        other_top_n: int,
    ) -> str:
        if token is None:
            return f"  {label}: no token at this position"
        line = (
            f"  {label}: token {token}{self._text([token])} "
            f"logprob {_fmt_lp(logprob)} (p={_fmt_p(_exp(logprob))})"
        )
        if other_top_n:
            if rank_in_other is None:
                line += (
                    f"; in {other} distribution: not in its recorded top-{other_top_n}"
                )
            else:
                line += (
                    f"; in {other} distribution: rank {rank_in_other}, "
                    f"logprob {_fmt_lp(logprob_in_other)} "
                    f"(p={_fmt_p(_exp(logprob_in_other))})"
                )
        return line

    def _context_line(self, d: TokenDiff) -> str:
        pre = d.preceding_token_ids
        if not pre:
            return "  preceding tokens: none (divergence at the first generated token)"
        last = pre[-CONTEXT_TOKENS:]
        return (
            f"  last {len(last)} of {len(pre)} preceding tokens: "
            f"ids {last}{self._text(last)}"
        )

    def _render(self, d: TokenDiff) -> str:
        rid = repr(d.request_id)
        ref_label = f"reference ({self.cmp.ref_target})"
        dev_label = f"device ({self.cmp.dev_target})"
        if d.outcome is TokenOutcome.MISSING:
            head = (
                f"token mismatch: request {rid} missing from {self.cmp.dev_target} "
                f"output (reference generated {_plural(d.ref_num_tokens, 'token')})"
            )
            return "\n".join([head, self._prompt_line(d)])
        if d.outcome is TokenOutcome.PROMPT_MISMATCH:
            return "\n".join(
                [f"token mismatch: request {rid}: {d.detail}", self._prompt_line(d)]
            )
        if d.outcome is TokenOutcome.LENGTH_MISMATCH:
            head = (
                f"token mismatch: request {rid} length differs: reference "
                f"{_plural(d.ref_num_tokens, 'token')} (finish {d.ref_finish_reason}), "
                f"device {_plural(d.dev_num_tokens or 0, 'token')} "
                f"(finish {d.dev_finish_reason}); {d.detail}"
            )
        elif d.outcome is TokenOutcome.NEAR_TIE:
            head = (
                f"near-tie accepted: request {rid} at position {d.position} "
                f"({self.cmp.policy.describe()}); positions after {d.position} not compared"
            )
        else:
            head = (
                f"token mismatch: request {rid} at position {d.position} "
                f"({_plural(d.position or 0, 'position')} equal before it); "
                f"positions after {d.position} not compared"
            )
        lines = [
            head,
            self._prompt_line(d),
            self._token_line(
                ref_label,
                d.ref_token_id,
                d.ref_logprob,
                "device",
                d.ref_rank_in_dev,
                d.ref_logprob_in_dev,
                d.dev_top_n,
            ),
            self._token_line(
                dev_label,
                d.dev_token_id,
                d.dev_logprob,
                "reference",
                d.dev_rank_in_ref,
                d.dev_logprob_in_ref,
                d.ref_top_n,
            ),
        ]
        if d.outcome in (TokenOutcome.MISMATCH, TokenOutcome.NEAR_TIE):
            lines.append(
                f"  probability gaps: in reference {_fmt_p(d.ref_gap)}, "
                f"in device {_fmt_p(d.dev_gap)} (tolerance {self.cmp.policy.prob_tol:g})"
            )
        if d.outcome is TokenOutcome.MISMATCH:
            lines.append(f"  {d.detail}")
        lines.append(self._context_line(d))
        return "\n".join(lines)
