"""The options of a harness session (``HilSession``), as the pytest plugin gathers them from the
command line, environment and defaults (``harness.plugin.fixtures``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.core.comparison import NearTiePolicy
from harness.engine.host import CALL_TIMEOUT
from harness.engine.pool import MAX_LIVE_ENGINES
from harness.triage.budget import TRIAGE_BUDGET, TRIAGE_MAX


@dataclass
class SessionOptions:
    """What a session is asked to do: where it keeps its cache and reports, its near-tie and
    logprob tolerances, engine reuse and limits, the faults it injects, its stack, triage."""

    cache_dir: Path
    reports_dir: Path
    near_tie: NearTiePolicy = field(default_factory=NearTiePolicy)
    # Backend -> its near-tie tolerance given as --near-tie-tol-BACKEND; absent (or None): the
    # calibrated one where a model is at hand, else the kind's default.
    near_tie_tols: dict[str, float | None] = field(default_factory=dict)
    engine_reuse: bool = True
    reference_cache: bool = True
    max_live_engines: int = MAX_LIVE_ENGINES
    start_timeout: float | None = None  # None: per kind and backend (harness.engine.pool.start_timeout)
    call_timeout: float = CALL_TIMEOUT
    faults: tuple[str, ...] = ()
    # The inventory's device faults, each as "SPEC (device ID)": named with ``faults`` in a
    # failure's text (they reach their device's engines by its env, not by ``faults``).
    device_faults: tuple[str, ...] = ()
    kv_probe: bool = True
    stack: str = "default"
    plan_only: bool = False  # record each test's engine configuration, start nothing
    engine_replace: bool = True  # replace an engine an earlier test left dirty (else: inherited)
    logprob_tol: float | None = None  # None: the fp32 default
    logprob_tol_card: float | None = None  # None: the precision's calibrated thresholds
    teacher_forcing: bool = True
    triage: bool = True  # re-run failed token-equality and KV verdicts (harness.triage)
    triage_max: int = TRIAGE_MAX
    triage_budget: float = TRIAGE_BUDGET
