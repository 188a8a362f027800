"""Stand-ins for the explorer's tests: a character tokenizer, and a runner whose examples fail
by a rule instead of on an engine."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

from harness.core.verdict import Verdict
from harness.explore.example import Example
from harness.explore.runner import FAILED, PASSED, REJECTED, Outcome
from harness.explore.strategies import GeometrySpace, WorkloadBounds
from harness.geometry.catalog import Geometry


class CharTokenizer:
    """One token per character: prompt lengths and shared prefixes are easy to read."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)


def spyre_admits(max_model_len: int, block: int = 64) -> Callable[[int, int], bool]:
    """A prompt padded to whole blocks plus max_tokens fits the context (as Spyre checks)."""
    return lambda p, m: -(-p // block) * block + m <= max_model_len


@dataclass
class RuleRunner:
    """Runs an example by a rule: ``fails(example)`` -> the check that fails, or None;
    ``refuses(geometry)`` -> why the geometry is refused, or None."""

    fails: Callable[[Example], str | None]
    refuses: Callable[[Geometry], str | None] = lambda g: None
    refused_at_start: Callable[[Geometry], str | None] = lambda g: None
    runs: list[Example] = field(default_factory=list)
    fresh: list[bool] = field(default_factory=list)  # per run: on an engine of its own?
    space_: GeometrySpace = field(default_factory=lambda: GeometrySpace(block_size=64,
                                                                        tkv_limit=True))
    hil: object = field(default_factory=lambda: SimpleNamespace(
        stats=lambda: SimpleNamespace(engines=[], timers={})))

    def space(self) -> GeometrySpace:
        return self.space_

    def geometry_refusal(self, geometry: Geometry) -> str | None:
        return self.refuses(geometry)

    def bounds(self, geometry: Geometry) -> WorkloadBounds:
        return WorkloadBounds.of(geometry, 64, spyre_admits(geometry.max_model_len))

    def run(self, example: Example, fresh: bool = False) -> Outcome:
        refused = self.refuses(example.geometry) or self.refused_at_start(example.geometry)
        if refused:
            return Outcome(REJECTED, refused, whole_geometry=True)
        self.runs.append(example)
        self.fresh.append(fresh)
        check = self.fails(example)
        if check is None:
            return Outcome(PASSED, verdicts=[Verdict.passed("kv_ledger")], seconds=0.5)
        return Outcome(FAILED, verdicts=[Verdict.failed(check, f"{check} broke")], seconds=0.5)


@dataclass
class ScriptedRunner:
    """Runs an example by a script: each run returns the next of ``outcomes`` (a finding's
    replays, say), and records whether it asked for a fresh engine."""

    outcomes: list[Outcome]
    fresh: list[bool] = field(default_factory=list)

    def run(self, example: Example, fresh: bool = False) -> Outcome:
        self.fresh.append(fresh)
        return self.outcomes[len(self.fresh) - 1]
