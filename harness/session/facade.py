"""HilSession: what a suite talks to, a facade over small parts.

Models and prompt sets (``ModelCatalog``), engines (``EnginePool`` and
``EngineDriver``), the CPU reference (``ReferenceRunner`` with its disk cache),
and the checks (``harness.checks``, which return ``Verdict``s: asked through
``SessionVerdicts``, harness.session.verdicts); its options are ``SessionOptions``
(harness.session.options). One session
lives per pytest process (per xdist worker); its listeners (the report) hear
what it ran and which verdicts it reached.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest

from harness.checks.agreement import AgreementTally
from harness.checks.capacity import KvPool
from harness.checks.exposure import ExposureTally
from harness.core.config import ConfigError, EngineConfig
from harness.core.errors import EngineRefused, EngineStartDefect
from harness.core.trace import KvSnapshot, Trace
from harness.engine.driver import DriverSettings, EngineDriver
from harness.engine.hygiene import EngineHygiene
from harness.engine.order import config_entry, config_id
from harness.engine.pool import EnginePool, PoolSettings
from harness.geometry.catalog import Geometry
from harness.lab.leases import LeaseManager
from harness.reference.cache import ReferenceCache
from harness.reference.runner import ReferenceRunner
from harness.scenario.catalog import Model, ModelCatalog
from harness.scenario.prompts import EngineLimits, PromptSet, Scenario
from harness.session.listeners import Listeners, SessionListener
from harness.session.options import SessionOptions
from harness.session.precision import PrecisionDesk, calibration_source
from harness.session.stats import SessionStats, Timers
from harness.session.verdicts import SessionVerdicts
from harness.stacks import host as host_stack
from harness.stacks.spec import load_stack, variant_problem
from harness.targets import kind, kind_of_label
from harness.targets.geometry import PAGED, pool_overrides
from harness.targets.variants import TargetVariant
from harness.triage.budget import TriageBudget
from harness.triage.judge import Policies
from harness.triage.record import TriageRecords
from harness.triage.runner import TriageRunner
from harness.triage.session_hook import TriageDesk

__all__ = ["HilSession", "Model", "SessionOptions"]


class HilSession(SessionVerdicts):
    """The harness facade used by suites through the ``hil`` fixture."""

    def __init__(self, opts: SessionOptions, leases: LeaseManager | None = None) -> None:
        self.opts = opts
        self.leases = leases
        self.timers = Timers()
        self.listeners = Listeners()
        self.models = ModelCatalog(opts.cache_dir)
        self.ref_cache = ReferenceCache(opts.cache_dir / "reference", enabled=opts.reference_cache)
        self._refs: dict[str, ReferenceRunner] = {}
        self.near_ties: list[str] = []
        # The reference's confidence per model: how much its token equality can mean.
        self.exposure = ExposureTally(opts.near_tie.prob_tol)
        # Teacher-forced agreement per target and model, and why a stack could not force.
        self.agreement = AgreementTally()
        self.current_test = ""
        self.test_configs: dict[str, str] = {}  # test node id -> its first engine configuration
        self.configs_seen: dict[str, dict[str, Any]] = {}  # their ids -> the configurations
        # The rules each trace is judged by, from its engine's precision (calibrated noise for
        # fp16 and bf16; harness.session.precision).
        # The --near-tie-tol-BACKEND values given (None: not given).
        self._near_tie_given = {b: t for b, t in opts.near_tie_tols.items() if t is not None}
        self.precision = PrecisionDesk(
            opts.near_tie, self._near_tie_of,
            lambda label: kind_of_label(label).backend_of(label) in self._near_tie_given,
            opts.logprob_tol, opts.logprob_tol_card, calibration_source(opts.cache_dir))
        self.refusal_expected = False  # set by expect_refusal() around a start the test expects to fail
        self._pool = EnginePool(PoolSettings(
            reports_dir=opts.reports_dir, max_live_engines=opts.max_live_engines,
            start_timeout=opts.start_timeout, engine_reuse=opts.engine_reuse,
            work_dir=opts.cache_dir / "engine-work"))
        if leases is not None:  # a lease let go to wait for a group takes its engines along
            leases.on_release = self._pool.discard_device
        self.engines = EngineDriver(
            self._pool,
            DriverSettings(call_timeout=opts.call_timeout, top_k=opts.near_tie.top_k,
                           kv_probe=opts.kv_probe),
            self.timers, self.listeners, self._device_failed, before_call=self._before_call)
        self.hygiene = EngineHygiene(self.engines.probe_idle,
                                     lambda: self.current_test, replace=opts.engine_replace)
        self.engines.hygiene = self.hygiene
        # Triage runs go through a driver of their own: no report events, their own timers.
        self.triage = TriageDesk(TriageRunner(
            self._pool,
            EngineDriver(self._pool, self.engines.settings, Timers(), Listeners(),
                         self._device_failed),
            Policies(lambda label: self.precision.last(label).near_tie,
                     lambda label: self.precision.last(label).logprob,
                     lambda label: self.precision.last(label).distribution),
            TriageBudget(opts.triage_max, opts.triage_budget,
                         enabled=opts.triage and not opts.plan_only)),
            # Known failures' triages, recorded once and reused (harness.triage.record).
            records=TriageRecords.in_cache(opts.cache_dir))

    # -- test lifecycle and listeners --------------------------------------------
    def begin_test(self, nodeid: str) -> None:
        """Name the running test (a device that fails is marked broken by it)."""
        self.current_test = nodeid
        self.triage.begin_test(nodeid)

    def add_listener(self, listener: SessionListener) -> None:
        self.listeners.add(listener)

    def remove_listener(self, listener: SessionListener) -> None:
        self.listeners.remove(listener)

    @contextlib.contextmanager
    def timed(self, name: str) -> Iterator[None]:
        """Add the wall time of the block to ``timers[name]`` (the benchmark's split)."""
        with self.timers.timed(name):
            yield

    # -- models and prompts -------------------------------------------------
    def model(self, value: str) -> Model:
        """Resolve ``tiny-llama``/``tiny-granite`` (built on demand) or a local folder."""
        return self.models.model(value)

    def scenario(self, prompt_set: str | PromptSet, case: str, model: Model,
                 variant: TargetVariant | None = None) -> Scenario:
        """Case ``case`` of ``prompt_set`` for ``model``; with ``variant``, in the limits its
        device compiles for the set's (``limits``)."""
        scenario = self.models.scenario(prompt_set, case, model)
        if variant is None:
            return scenario
        return replace(scenario, limits=kind(variant.target).compiled_limits(variant, scenario.limits))

    def limits(self, variant: TargetVariant, max_model_len: int, max_num_seqs: int,
               cp_chunk: int | None = 128, round_batch: bool = False) -> EngineLimits:
        """The engine limits a test asks for, as ``variant``'s device compiles them: on a
        Spyre card a context of at least 512 (harness.targets.spyre.card_shape), the test's
        own elsewhere; with ``round_batch`` (a test whose batch size is its choice, not its
        subject) the batch too. A test that sizes its requests or its batch by the limits
        reads them from here."""
        return kind(variant.target).compiled_limits(
            variant, EngineLimits(max_model_len, max_num_seqs, cp_chunk=cp_chunk), round_batch)

    # -- engines ------------------------------------------------------------
    def engine_config(
        self, variant: TargetVariant, model: Model, scenario: Scenario,
        pool: str | None = None, geometry: Geometry | None = None, **overrides: Any,
    ) -> EngineConfig:
        """The engine of ``variant`` for ``scenario``; ``pool`` names a KV pool preset
        (``harness.targets.geometry``) that each target turns into its own settings; a named
        ``geometry`` (``harness.geometry``) sets the pool, prefix caching and batch TKV limit
        its kind takes for it."""
        overrides = {**pool_overrides(variant.target, pool, scenario.limits, self.opts.stack),
                     **overrides}
        if geometry is not None:  # the geometry's pool, caching and limits; the test's own win
            shaped = kind(variant.target).geometry_overrides(geometry, self.opts.stack)
            if "extra_env" in shaped:
                shaped["extra_env"] = (*variant.device_env, *shaped["extra_env"])
            overrides = {**shaped, **overrides}
        if self.opts.faults and "faults" not in overrides:
            overrides["faults"] = self.opts.faults
        overrides.setdefault("stack", self.opts.stack)
        cfg = variant.engine_config(str(model.path), scenario.limits, **overrides)
        problem = kind(variant.target).compile_problem(cfg)
        if problem:  # the device would refuse it at start: the test's shape does not run there
            chunk = (f", chunk {cfg.max_num_batched_tokens}"
                     if cfg.max_num_batched_tokens is not None else "")
            pytest.skip(f"{problem}; this test's engine: context {cfg.max_model_len}, batch"
                        f" {cfg.max_num_seqs}{chunk}")
        return cfg

    def block_size(self, variant: TargetVariant, geometry: str = PAGED) -> int | None:
        """The block size of ``variant``'s ``geometry`` on this session's stack (the size its
        software takes); None for one block per sequence."""
        return kind(variant.target).stack_geometry(geometry, self.opts.stack).block_size

    def stack_problem(self, variant: TargetVariant, markers: tuple[str, ...] = ()) -> str | None:
        """Why ``variant`` (in a test with these markers) cannot run on this session's stack."""
        if host_stack.is_unpinned(self.opts.stack):
            return None

        stack = load_stack(self.opts.stack)
        for m in markers:
            if m in stack.unsupported_suites:
                return f"suite {m} does not run on stack {stack.name}: {stack.unsupported_suites[m]}"
        return variant_problem(stack, variant.id)

    def check_scenario(self, cfg: EngineConfig, scenario: Scenario) -> None:
        """Refuse requests the engine would refuse, before any engine starts."""
        self.engines.check_scenario(cfg, scenario)

    def generate(self, cfg: EngineConfig, scenario: Scenario,
                 teacher: Trace | None = None) -> Trace:
        """Run every request of ``scenario`` in one engine call on the engine of ``cfg``; with
        ``teacher`` (the reference), that call also runs each request teacher-forced with the
        reference's tokens (``Trace.forced``; off with ``--no-teacher-forcing``)."""
        if not self.opts.teacher_forcing:
            teacher = None
        trace = self.engines.generate(cfg, scenario, teacher)
        self.triage.ran(cfg, scenario, "generate", teacher, trace)
        return trace

    def run_steps(self, cfg: EngineConfig, scenario: Scenario, probe: bool | None = None) -> Trace:
        """Drive ``scenario`` one engine step at a time, recording scheduler and KV state."""
        trace = self.engines.run_steps(cfg, scenario, probe)
        self.triage.ran(cfg, scenario, "run_steps", None, trace)
        return trace

    def kv_snapshot(self, cfg: EngineConfig) -> list[KvSnapshot]:
        """The engine's KV ledgers right now (after start-up: an idle point)."""
        return self.engines.kv_snapshot(cfg)

    def kv_pool(self, cfg: EngineConfig) -> KvPool:
        """The KV pool (block count, size, pad blocks) the engine of ``cfg`` decided on."""
        return self.engines.kv_pool(cfg)

    def engine_started(self, cfg: EngineConfig) -> bool:
        """Whether this session started an engine of ``cfg``."""
        return self._pool.was_started(cfg)

    def _before_call(self, cfg: EngineConfig) -> None:
        """Record the test's engine configuration (the test order of the next run); in a plan
        pass (``--hil-plan``) start nothing."""
        cid = config_id(cfg)
        self.test_configs.setdefault(self.current_test, cid)
        if cid not in self.configs_seen:  # once per configuration, not at every call
            self.configs_seen[cid] = config_entry(cfg)
        if self.opts.plan_only:
            pytest.skip(f"plan only: recorded engine configuration {cfg.label}")

    @contextlib.contextmanager
    def expect_refusal(self) -> Iterator[None]:
        """Within this block an engine that refuses to start (raises during start, process alive)
        does not mark its device broken; a crash or hang at start still does. A programming
        error raised at start (a TypeError, an AttributeError...) is no refusal: it leaves the
        block as an EngineStartError, which no test takes for its expected refusal."""
        self.refusal_expected = True
        try:
            yield
        except EngineRefused as e:
            if not e.defect:
                raise
            raise EngineStartDefect(
                f"{str(e).splitlines()[0]} -- a {e.error_type} at start is a defect of the"
                " stack, not a refusal of its configuration", e.log_tail) from None
        finally:
            self.refusal_expected = False

    def _device_failed(self, cfg: EngineConfig, error: Exception) -> None:
        # A refusal the test expects (it asserts on it) is the device working as specified.
        if self.refusal_expected and isinstance(error, EngineRefused):
            return
        self._mark_device_broken(cfg, error)

    def _mark_device_broken(self, cfg: EngineConfig, error: Exception) -> None:
        if cfg.device and self.leases is not None:
            for lease in self.leases.held.values():
                if lease.device.id == cfg.device:
                    self.leases.mark_broken(lease.device, self.current_test, str(error))

    # -- the reference --------------------------------------------------------
    def reference(self, model: Model, scenario: Scenario) -> Trace:
        """CPU reference outputs for every request (cached on disk)."""
        for r in scenario.requests:
            if len(r.prompt_token_ids) + r.max_tokens > scenario.limits.max_model_len:
                raise ConfigError(
                    f"scenario {scenario.name}, request {r.request_id}: prompt of"
                    f" {len(r.prompt_token_ids)} tokens + max_tokens {r.max_tokens} exceeds"
                    f" max_model_len {scenario.limits.max_model_len}"
                )
        runner = self._refs.get(model.content_hash)
        if runner is None:
            runner = ReferenceRunner(model.path, model.content_hash, self.ref_cache,
                                     top_k=self.opts.near_tie.top_k)
            self._refs[model.content_hash] = runner
        with self.timers.timed("reference"):
            trace = runner.generate(scenario)
        self.triage.referenced(scenario, trace)
        for r in trace.requests.values():
            self.exposure.add(model.label, r)
        return trace

    # -- bookkeeping --------------------------------------------------------
    def stats(self) -> SessionStats:
        return SessionStats(
            engines=[{"config": s.config, "key": s.key, "seconds": s.seconds}
                     for s in self._pool.started],
            reference_hits=self.ref_cache.hits,
            reference_misses=self.ref_cache.misses,
            near_ties=list(self.near_ties),
            timers=self.timers.rounded(),
            exposure=self.exposure.to_dict(),
            agreement=self.agreement.to_dict(),
            reference_bad=list(self.ref_cache.bad),
            cards=self._pool.device_ledger.to_list(),
            leases=[lease.describe() for lease in self.leases.held.values()] if self.leases else [],
            hygiene=asdict(self.hygiene.stats),
            triage=[r.to_dict() for r in self.triage.results],
            calibrations=list(self.precision.used.values()),
        )

    def write_stats(self, worker: str, warnings: Sequence[str] = ()) -> Path:
        """reports/stats/WORKER.json: this worker's record, with ``warnings`` (what the run
        warned of its files and quarantine) for the summary."""
        out = self.opts.reports_dir / "stats"
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{worker}.json"
        stats = self.stats()
        stats.warnings = list(warnings)
        path.write_text(json.dumps(stats.to_dict(), indent=1))
        return path

    def stop_engines(self) -> None:
        """Stop every engine (their stops go into the device ledger before it is written)."""
        self._pool.close()

    def close(self) -> None:
        """Stop every engine, then give the leased devices back."""
        self._pool.close()
        if self.leases is not None:
            self.leases.release_all()
