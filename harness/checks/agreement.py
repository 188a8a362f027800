"""The run-level table of teacher-forced agreement, per target and model.

Each session adds every forced comparison it judged; the terminal summary and
``summary.md`` merge the sessions' tallies (one per xdist worker) into one
table: positions compared, agreement rate, disagreements, the largest logprob
deviation, and the model's near-tie exposure beside it (``harness.checks.exposure``).
Targets whose stack cannot force say why.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from harness.checks.exposure import DEFAULT_TOL, ExposureTally
from harness.checks.forcing import ForcedComparison


class AgreementTally:
    """Forced positions and agreements per (target, model)."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, Any]] = {}
        self.reasons: dict[str, str] = {}

    @staticmethod
    def _key(target: str, model: str) -> str:
        return f"{target} | {model}"

    def add(self, target: str, model: str, forced: ForcedComparison) -> None:
        row = self.rows.setdefault(self._key(target, model), {
            "target": target, "model": model, "positions": 0, "agree": 0, "max_dev": 0.0})
        row["positions"] += forced.num_positions()
        row["agree"] += forced.num_positions() - forced.disagreements()
        top = forced.logprob_comparison().largest()
        if top is not None:
            row["max_dev"] = max(row["max_dev"], min(top[1].value, 1e9))

    def unsupported(self, target: str, model: str, why: str) -> None:
        self.reasons[self._key(target, model)] = why

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "reasons": self.reasons}

    def merge(self, d: dict[str, Any]) -> None:
        for key, row in (d.get("rows") or {}).items():
            mine = self.rows.setdefault(key, {**row, "positions": 0, "agree": 0, "max_dev": 0.0})
            mine["positions"] += row["positions"]
            mine["agree"] += row["agree"]
            mine["max_dev"] = max(mine["max_dev"], row["max_dev"])
        self.reasons.update(d.get("reasons") or {})


def exposure_shares(exposure_tallies: Iterable[dict[str, Any]]) -> dict[str, float]:
    """Near-tie exposure per model from workers' ``ExposureTally.to_dict``s."""
    tally: ExposureTally | None = None
    for data in exposure_tallies:
        if tally is None:
            tally = ExposureTally(float(data.get("tol", DEFAULT_TOL)))
        tally.merge(data)
    return {} if tally is None else {m: e.share for m, e in tally.exposures().items()}


def agreement_lines(tallies: Iterable[dict[str, Any]],
                    exposure_tallies: Iterable[dict[str, Any]] = ()) -> list[str]:
    """A markdown table (one row per target and model, with the model's near-tie exposure)
    and one line per target that could not force; empty when no forced run was judged."""
    tally = AgreementTally()
    for t in tallies:
        tally.merge(t or {})
    if not tally.rows and not tally.reasons:
        return []
    exposure = exposure_shares(exposure_tallies)
    lines = ["| target | model | forced positions | agreement | disagreements"
             " | largest logprob deviation | near-tie exposure |",
             "|---|---|---|---|---|---|---|"]
    for row in sorted(tally.rows.values(), key=lambda r: (r["target"], r["model"])):
        n, agree = row["positions"], row["agree"]
        rate = f"{100 * agree / n:.1f} %" if n else "-"
        exp = exposure.get(row["model"])
        exp_text = "-" if exp is None else f"{100 * exp:.1f} %"
        lines.append(f"| {row['target']} | {row['model']} | {n} | {rate} | {n - agree}"
                     f" | {row['max_dev']:.3g} | {exp_text} |")
    lines += [f"not forced: {why}" for why in sorted(set(tally.reasons.values()))]
    return lines
