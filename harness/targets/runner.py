"""The common verbs: what the CPU reference and every engine target answer (as vLLM's
HfRunner and VllmRunner), and an engine target of a session's pool as such a runner."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from harness.core.config import EngineConfig

if TYPE_CHECKING:
    from harness.core.trace import Trace
    from harness.scenario.prompts import Scenario

@runtime_checkable
class Runner(Protocol):
    """What the reference and every engine target answer: the same verb, the same
    input, the same Trace (as vLLM's HfRunner and VllmRunner)."""

    label: str

    def generate(self, scenario: Scenario) -> Trace:
        """Greedy outputs, with top-k log-probabilities, for every request of ``scenario``."""
        ...


class EngineRunner:
    """An engine target as a Runner: the engine of ``cfg`` in a session's pool."""

    def __init__(self, session: Any, cfg: EngineConfig) -> None:
        self.session = session  # HilSession (not imported: it imports this package)
        self.cfg = cfg
        self.label = cfg.label

    def generate(self, scenario: Scenario) -> Trace:
        return self.session.generate(self.cfg, scenario)  # type: ignore[no-any-return]

    def run_steps(self, scenario: Scenario) -> Trace:
        """The engine-only verb: one engine step at a time, with scheduler and KV state."""
        return self.session.run_steps(self.cfg, scenario)  # type: ignore[no-any-return]
