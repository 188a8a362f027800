"""One example on the session's engines: rejected, passed or failed.

A geometry the target's kind cannot run (``geometry_problem``), one this machine cannot hold,
an engine configuration the kind refuses (``ConfigError``) and an engine that refuses to start
(``EngineRefused``, a pool too small for one request...) are rejections, not findings: the
search counts them and moves on. An engine that crashes, hangs or fails a call during the run
is a finding (``engine_error``; the next example gets another engine), and so is every failed
verdict of the judge (``harness.explore.judge``), unless it is a known failure of the stack
(an entry of ``quarantine.toml`` that names the verdict; ``known.py``).

Examples of one geometry run on one engine (the session's pool reuses it); the session's
hygiene replaces an engine an example left dirty before the next one runs. Where the engine
caches prefixes, each run's prompts get a text of their own (``Example.scenario``'s salt), so an
example never meets the prefixes an earlier one left in the cache.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harness.checks.device_blocks import check_device_count
from harness.core.config import ConfigError, EngineConfig
from harness.core.errors import (
    DeviceMismatch,
    EngineCrashed,
    EngineError,
    EngineRefused,
    EngineRequestError,
    EngineStartDefect,
    EngineStartError,
    EngineTimeout,
)
from harness.core.trace import KvSnapshot, Trace
from harness.core.verdict import KV_LEDGER, Verdict
from harness.engine.pool import prefix_caching_on
from harness.explore.example import Example
from harness.explore.judge import Judge
from harness.explore.known import ENGINE_ERROR, default_known, known_failure
from harness.explore.strategies import GeometrySpace, WorkloadBounds
from harness.geometry.catalog import Geometry, GeometryError
from harness.geometry.fit import fit_problem
from harness.scenario.prompts import EngineLimits, Scenario
from harness.targets import kind, target_for

if TYPE_CHECKING:
    from collections.abc import Sequence

    from harness.lab.quarantine import KnownFailure
    from harness.scenario.catalog import Model
    from harness.session.facade import HilSession
    from harness.targets.variants import TargetVariant

PASSED, FAILED, REJECTED = "passed", "failed", "rejected"


@dataclass
class Outcome:
    """What one example came to: ``status`` (passed, failed or rejected), why it was rejected
    (``reason``; ``whole_geometry``: the engine of its geometry refused, so every example of
    it would be), its verdicts, the known failures it met, the seconds it took, and its trace
    (or the engine's error)."""

    status: str
    reason: str = ""
    whole_geometry: bool = False
    verdicts: list[Verdict] = field(default_factory=list)
    known: list[KnownFailure] = field(default_factory=list)
    seconds: float = 0.0
    trace: Trace | None = None
    error: EngineError | None = None  # the engine's crash, hang or failed call

    @property
    def failures(self) -> list[Verdict]:
        """The failed verdicts that are no known failure."""
        known = {k.check for k in self.known}
        return [v for v in self.verdicts if not v.ok and v.check not in known]

    @property
    def failure(self) -> Verdict | None:
        """The first failed verdict that is no known failure: the finding's check."""
        failures = self.failures
        return failures[0] if failures else None

    @property
    def judged(self) -> list[Verdict]:
        """Every verdict but the known failures: what a regression test expects to hold."""
        known = {k.check for k in self.known}
        return [v for v in self.verdicts if v.ok or v.check not in known]


def first_line(text: object, limit: int = 240) -> str:
    line = str(text).strip().splitlines()[0] if str(text).strip() else str(text)
    return line if len(line) <= limit else line[: limit - 3] + "..."


def model_config(model: Model) -> dict[str, Any] | None:
    """The model folder's HF config (what the machine-fit check reads)."""
    try:
        return json.loads((model.path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


class ExampleRunner:
    """Runs examples for one target variant and model in one session."""

    def __init__(self, hil: HilSession, model: Model, variant: TargetVariant,
                 known: Sequence[KnownFailure] | None = None, own_tests: bool = True,
                 tensor_parallel: tuple[int, ...] = (1,)) -> None:
        self.hil = hil
        # Each example is a test of its own to the session (its engine handed over clean);
        # a regression test replaying one is the session's test already.
        self.own_tests = own_tests
        self.model = model
        self.variant = variant
        self.stack = hil.opts.stack
        self.kind = kind(variant.target)
        self.pool_geometry = self.kind.stack_geometry(self.kind.sized_pool_geometry, self.stack)
        # the stack's known failures: quarantine.toml's entries of explorer verdicts
        self.known = tuple(default_known() if known is None else known)
        self.tensor_parallel = tensor_parallel
        self.judge = Judge(hil, model, variant, holds_back_for_tkv=(
            self.kind.batch_tkv_limit_env is not None and "pausing" not in variant.capabilities))
        self._config = model_config(model)
        self.runs = 0  # examples run on an engine (each one's prompts salted apart)

    # -- what the search draws from ------------------------------------------------------
    def space(self) -> GeometrySpace:
        """The geometries this target can be asked to serve: on a device that compiles some
        shapes only (a Spyre card), its contexts and batches among those drawn."""
        base = GeometrySpace(block_size=self.pool_geometry.block_size)
        contexts = tuple(c for c in base.context_lengths if self._compiled(c, base.max_num_seqs)
                         == (c, base.max_num_seqs))
        batches = tuple(n for n in range(1, base.max_num_seqs + 1)
                        if self._compiled(max(contexts or base.context_lengths), n)[1] == n)
        compiled = contexts != base.context_lengths or len(batches) != base.max_num_seqs
        return GeometrySpace(block_size=self.pool_geometry.block_size,
                             pad_blocks=self.pool_geometry.pad_blocks,
                             tkv_limit=self.kind.batch_tkv_limit_env is not None,
                             tensor_parallel=self.tensor_parallel_sizes(),
                             context_lengths=contexts or base.context_lengths,
                             batch_sizes=batches if compiled and batches else None)

    def _compiled(self, max_model_len: int, max_num_seqs: int) -> tuple[int, int]:
        """The (context, batch) the target's device compiles for this shape."""
        limits = self.kind.compiled_limits(self.variant, EngineLimits(max_model_len, max_num_seqs),
                                           round_batch=True)
        return limits.max_model_len, limits.max_num_seqs

    def tensor_parallel_sizes(self) -> tuple[int, ...]:
        """The ranks per engine asked for (``--tensor-parallel``) that this target runs here,
        1 first; a size it cannot run is said once and left out."""
        sizes = [1]
        for n in self.tensor_parallel:
            if n == 1 or n in sizes:
                continue
            problem = self.kind.tensor_parallel_problem(self.variant, n, self.stack)
            if problem is None and self.variant.device:
                problem = (f"the search holds the one device {self.variant.device} it leased;"
                           " a group of devices per engine is leased by the suites"
                           " (--geometry with a tensor_parallel_size)")
            if problem:
                print(f"hil explore: {self.variant.id}: TP {n} not searched: {problem}",
                      flush=True)
            else:
                sizes.append(n)
        return tuple(sizes)

    def geometry_refusal(self, geometry: Geometry) -> str | None:
        """Why this target cannot run ``geometry`` before any engine starts, or None."""
        problem = self.kind.geometry_problem(self.variant, geometry, self.stack)
        if problem:
            return problem
        if self._config is not None:
            problem = fit_problem(geometry, self.model.label, self._config)
            if problem:
                return problem
        try:
            self.config(geometry, self._empty(geometry))
        except ConfigError as e:
            return first_line(e)
        return None

    def bounds(self, geometry: Geometry) -> WorkloadBounds:
        """What a workload in ``geometry`` may hold: the engine's own request check decides
        how many tokens a prompt leaves room for."""
        cfg = self.config(geometry, self._empty(geometry))
        target = target_for(cfg)

        def admits(prompt_len: int, max_tokens: int) -> bool:
            try:
                target.check_request(prompt_len, max_tokens)
            except ConfigError:
                return False
            return True

        block = cfg.block_size or self.pool_geometry.block_tokens(geometry.max_model_len)
        return WorkloadBounds.of(geometry, block, admits)

    # -- one example ---------------------------------------------------------------------
    def config(self, geometry: Geometry, scenario: Scenario) -> EngineConfig:
        """The engine of ``scenario`` in ``geometry``: the geometry's pool, caching and limits
        as the kind takes them (a block count in the kind's block size where it sets one)."""
        extra: dict[str, Any] = {}
        if geometry.num_blocks is not None and not self.pool_geometry.fixed:
            extra["block_size"] = self.pool_geometry.block_tokens(geometry.max_model_len)
        return self.hil.engine_config(self.variant, self.model, scenario, geometry=geometry,
                                      **extra)

    def missing_device_blocks(self, cfg: EngineConfig) -> Verdict | None:
        """The ``device_blocks`` invariant at start, before any request runs: a pool larger
        than the KV cache the device allocated hands out blocks with no memory behind them,
        and a run would write there (vLLM's CPU runner can hang on it, and an example's
        engine-timeout is minutes). The verdict the step-driven ledger would give at step -1,
        or None where the pool's blocks all exist (or the device's count is not read)."""
        pool = self.hil.kv_pool(cfg)
        if pool.device_blocks is None or pool.num_blocks <= pool.device_blocks:
            return None
        snapshot = KvSnapshot(source=pool.source, num_blocks=pool.num_blocks, pad_blocks=[],
                              free_blocks=[], owned={}, block_size=pool.block_size,
                              device_blocks=pool.device_blocks)
        (v,) = check_device_count(snapshot)
        return Verdict.failed(f"{KV_LEDGER}.{v.invariant}",
                              f"kv invariant {v.invariant} broken at start: {v.message}", at=-1)

    @staticmethod
    def _empty(geometry: Geometry) -> Scenario:
        return Scenario("explore-geometry", [], geometry.limits())

    def run(self, example: Example, fresh: bool = False) -> Outcome:
        """Run ``example`` on its geometry's engine and judge it; with ``fresh``, on an engine
        started for this run alone (no earlier example's state: what a regression test
        meets)."""
        t0 = time.monotonic()
        try:
            geometry = example.geometry
        except GeometryError as e:
            return Outcome(REJECTED, first_line(e), whole_geometry=True)
        refusal = self.geometry_refusal(geometry)
        if refusal:
            return Outcome(REJECTED, refusal, whole_geometry=True)
        try:
            cfg = self.config(geometry, self._empty(geometry))
            salt = self.runs + 1 if prefix_caching_on(cfg) else 0
            scenario = example.scenario(self.model.tokenizer, salt)
            cfg = self.config(geometry, scenario)
            self.hil.check_scenario(cfg, scenario)
        except ConfigError as e:
            return Outcome(REJECTED, first_line(e))
        self.runs += 1
        if self.own_tests:  # a run of its own, even of an example run before
            self.hil.begin_test(f"explore::{example.key}::{self.runs}")
        if fresh:  # the pool starts another engine of this configuration for it
            self.hil.engines.pool.discard(cfg.key)
        try:
            with self.hil.expect_refusal():
                missing = self.missing_device_blocks(cfg)
                if missing is not None:
                    known = known_failure(missing, example, self.variant.id, self.stack,
                                          self.known)
                    if known is None:  # its run would write KV where the device has none
                        return Outcome(FAILED, verdicts=[missing],
                                       seconds=time.monotonic() - t0)
                trace = self.hil.run_steps(cfg, scenario)
        except DeviceMismatch:
            raise  # the device is not the one asked for: no example can tell anything
        except EngineStartDefect as e:  # a TypeError at start: found, not a refusal
            failed = Verdict.failed(ENGINE_ERROR, first_line(e), details=str(e))
            return Outcome(FAILED, verdicts=[failed], seconds=time.monotonic() - t0, error=e)
        except (EngineRefused, ConfigError) as e:
            return Outcome(REJECTED, f"the engine refused it at start: {first_line(e)}",
                           whole_geometry=True, seconds=time.monotonic() - t0)
        except EngineStartError as e:
            return Outcome(REJECTED, f"the engine did not start: {first_line(e)}",
                           whole_geometry=True, seconds=time.monotonic() - t0)
        except (EngineCrashed, EngineTimeout, EngineRequestError) as e:
            # Whatever the engine still holds (a request that never finished), the next
            # example gets another engine.
            self.hil.engines.pool.discard(cfg.key)
            failed = Verdict.failed(ENGINE_ERROR, f"{type(e).__name__}: {first_line(e)}",
                                    details=f"{type(e).__name__}: {e}")
            known = known_failure(failed, example, self.variant.id, self.stack, self.known)
            return Outcome(PASSED if known else FAILED, verdicts=[failed],
                           known=[known] if known else [], seconds=time.monotonic() - t0,
                           error=e)
        verdicts = self.judge.verdicts(geometry, example.requests, scenario, trace)
        known = [k for v in verdicts
                 if (k := known_failure(v, example, self.variant.id, self.stack, self.known))]
        outcome = Outcome(PASSED, verdicts=verdicts, known=known,
                          seconds=time.monotonic() - t0, trace=trace)
        if outcome.failure is not None:
            outcome.status = FAILED
        return outcome
