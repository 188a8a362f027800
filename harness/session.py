"""HilSession: what a suite talks to (models, references, engines, verdicts).

One HilSession lives per pytest process (per xdist worker). It keeps one live
engine per distinct EngineConfig (``EnginePool``), one reference runner per
model, and counters that the plugin reports at the end of the run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import card, host_stack
from harness.capacity import CapacityError, check_capacity, preflight_config
from harness.compare import NearTiePolicy, TraceComparison, compare_traces
from harness.engine_config import ConfigError, EngineConfig
from harness.engine_host import (
    EngineCrashed,
    EngineError,
    EngineHost,
    EngineRefused,
    EngineRequestError,
    EngineStartError,
    EngineTimeout,
)
from harness.leases import LeaseManager
from harness.reference_cache import ReferenceCache
from harness.scenario import PromptSet, Scenario
from harness.targets import target_for
from harness.targets.cpu_ref import ReferenceRunner
from harness.trace import RequestTrace, Trace
from harness.variants import TargetVariant

log = logging.getLogger("harness")


@dataclass
class Model:
    """A resolved model folder with its tokenizer and content hash."""

    label: str
    path: Path
    content_hash: str
    tokenizer: Any

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)


@dataclass
class SessionOptions:
    cache_dir: Path
    reports_dir: Path
    near_tie: NearTiePolicy = field(default_factory=NearTiePolicy)
    near_tie_tol_sendnn: float = card.NEAR_TIE_TOL_SENDNN  # the card computes fp16
    engine_reuse: bool = True
    reference_cache: bool = True
    max_live_engines: int = 3
    start_timeout: float | None = None  # None: per backend (harness.card.START_TIMEOUTS)
    call_timeout: float = 900.0
    faults: tuple[str, ...] = ()
    kv_probe: bool = True
    stack: str = "default"
    plan_only: bool = False  # record each test's engine configuration, start nothing


def stack_runtime(cfg: EngineConfig) -> tuple[str | None, dict[str, str], dict[str, Any]]:
    """The python, environment and LLM arguments the engine's stack adds (none for default)."""
    if cfg.stack == "default":
        return None, {}, {}
    if cfg.stack == host_stack.HOST:
        return host_stack.host_python(), {}, {}
    from harness.stacks import load_stack, stack_python

    stack = load_stack(cfg.stack)
    python = stack_python(cfg.stack)
    if python is None:
        raise EngineStartError(
            f"stack {cfg.stack} is not installed (or its pins changed): run ./setup.sh --stack {cfg.stack}"
        )
    variant = cfg.label.split(":", 1)[-1]
    env = {**stack.env, **stack.target_env.get(variant, {})}
    return str(python), env, dict(stack.engine)


class EnginePool:
    """One live EngineHost per EngineConfig, least recently used evicted first.

    A configuration whose engine failed to start is remembered: later tests
    with it fail at once with the original error instead of starting again.
    """

    def __init__(self, opts: SessionOptions) -> None:
        self.opts = opts
        self._live: OrderedDict[str, EngineHost] = OrderedDict()
        self._failed: dict[str, EngineError] = {}
        self.started: list[dict[str, Any]] = []
        self.cards = card.CardLedger()  # starts and stops per card (one engine per card)

    def get(self, cfg: EngineConfig) -> EngineHost:
        key = cfg.key
        if key in self._failed:
            raise self._failed[key]
        host = self._live.get(key)
        if host is not None and host.alive:
            self._live.move_to_end(key)
            return host
        if host is not None:
            self.discard(key)
        if card.is_card_config(cfg):  # a card cannot load two models at once
            for other in self.cards.live_on(str(cfg.device)):
                self.discard(other)
        while len(self._live) >= max(1, self.opts.max_live_engines):
            self.discard(next(iter(self._live)))
        target = target_for(cfg)
        python, stack_env, stack_kwargs = stack_runtime(cfg)
        try:
            preflight_config(cfg)
        except CapacityError as e:
            self._failed[key] = e
            raise
        try:
            env = target.engine_env()
            env.update(stack_env)
            env.update(dict(cfg.extra_env))
            llm_kwargs = {**target.llm_kwargs(), **stack_kwargs}
            host = EngineHost(
                cfg,
                env,
                llm_kwargs,
                self.opts.reports_dir / "engine-logs",
                start_timeout=card.start_timeout(cfg, self.opts.start_timeout),
                python=python,
            )
        except EngineError as e:
            if card.is_card_config(cfg):
                self.cards.started(cfg, ok=False)
            self._failed[key] = e
            raise
        if card.is_card_config(cfg):
            self.cards.started(cfg)
        problem = card.verify_card_engine(cfg, host.info, card.log_since(host.log_path, host.log_offset))
        if problem:
            tail = host.log_tail()
            self._close(key, host)
            self._failed[key] = card.CardMismatch(problem, tail)
            raise self._failed[key]
        try:
            check_capacity(cfg, host.info)
        except CapacityError as e:
            self._close(key, host)
            self._failed[key] = e
            raise
        self.started.append({"config": cfg.label, "key": key, "seconds": round(host.start_seconds, 2)})
        self._live[key] = host
        return host

    def release(self, cfg: EngineConfig) -> None:
        """Stop the engine of ``cfg`` unless engines are reused across tests."""
        if not self.opts.engine_reuse:
            self.discard(cfg.key)

    def discard(self, key: str) -> None:
        host = self._live.pop(key, None)
        if host is not None:
            self._close(key, host)

    def _close(self, key: str, host: EngineHost) -> None:
        host.close()
        self.cards.closed(key)

    def close(self) -> None:
        for key in list(self._live):
            self.discard(key)


class HilSession:
    """The harness facade used by suites through the ``hil`` fixture."""

    def __init__(self, opts: SessionOptions) -> None:
        self.opts = opts
        self.pool = EnginePool(opts)
        self.ref_cache = ReferenceCache(opts.cache_dir / "reference", enabled=opts.reference_cache)
        self._models: dict[str, Model] = {}
        self._refs: dict[str, ReferenceRunner] = {}
        self.near_ties: list[str] = []
        self.leases: LeaseManager | None = None
        self.timers: dict[str, float] = {}
        self.current_test = ""
        self.test_configs: dict[str, str] = {}  # test node id -> its first engine configuration
        self.refusal_expected = False  # set by expect_refusal() around a start the test expects to fail
        # Evidence listeners, called as listener(event, data) with what the session ran
        # and saw: "scenario" (config, scenario), "engine" (config, log_path, log_offset),
        # "trace" (config, scenario, trace), "kv_snapshot" (config, snapshots),
        # "comparison" (scenario, reference, trace, verdict), "ledger" (trace, report).
        # The report plugin attaches them; they never change a run.
        self.listeners: list[Callable[[str, dict[str, Any]], None]] = []

    def _notify(self, event: str, **data: Any) -> None:
        for listener in list(self.listeners):
            try:
                listener(event, data)
            except Exception:  # a report problem must never fail or alter a test
                log.exception("evidence listener failed on %r", event)

    # -- models and prompts -------------------------------------------------
    def model(self, value: str) -> Model:
        """Resolve ``tiny-llama``/``tiny-granite`` (built on demand) or a local folder."""
        if value not in self._models:
            from transformers import AutoTokenizer

            from fixtures.models import model_content_hash, resolve_model

            path = resolve_model(value, self.opts.cache_dir)
            digest = model_content_hash(path, memo_dir=self.opts.cache_dir / "model-hash")
            tok = AutoTokenizer.from_pretrained(str(path))
            label = value if os.sep not in value else path.name
            self._models[value] = Model(label=label, path=path, content_hash=digest, tokenizer=tok)
        return self._models[value]

    def scenario(self, prompt_set: str | PromptSet, case: str, model: Model) -> Scenario:
        ps = prompt_set if isinstance(prompt_set, PromptSet) else PromptSet.load(prompt_set)
        return ps.scenario(case, model.tokenizer)

    # -- running ------------------------------------------------------------
    def engine_config(
        self, variant: TargetVariant, model: Model, scenario: Scenario, **overrides: Any
    ) -> EngineConfig:
        if self.opts.faults and "faults" not in overrides:
            overrides["faults"] = self.opts.faults
        overrides.setdefault("stack", self.opts.stack)
        return variant.engine_config(str(model.path), scenario.limits, **overrides)

    def stack_problem(self, variant: TargetVariant, markers: tuple[str, ...] = ()) -> str | None:
        """Why ``variant`` (in a test with these markers) cannot run on this session's stack."""
        if host_stack.is_unpinned(self.opts.stack):
            return None
        from harness.stacks import load_stack, stack_python

        stack = load_stack(self.opts.stack)
        for m in markers:
            if m in stack.unsupported_suites:
                return f"suite {m} does not run on stack {stack.name}: {stack.unsupported_suites[m]}"
        if variant.id in stack.unsupported:
            return f"{variant.id} does not run on stack {stack.name}: {stack.unsupported[variant.id]}"
        if stack.targets and variant.id not in stack.targets:
            return f"{variant.id} is not among the targets of stack {stack.name}"
        if stack_python(stack.name) is None:
            return f"stack {stack.name} is not installed: run ./setup.sh --stack {stack.name}"
        return None

    def check_scenario(self, cfg: EngineConfig, scenario: Scenario) -> None:
        """Refuse requests the engine would refuse, before any engine starts."""
        target = target_for(cfg)
        for r in scenario.requests:
            try:
                target.check_request(len(r.prompt_token_ids), r.max_tokens)
            except ConfigError as e:
                raise ConfigError(f"scenario {scenario.name}, request {r.request_id}: {e}") from None

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
            runner = ReferenceRunner(model.path, model.content_hash, self.ref_cache)
            self._refs[model.content_hash] = runner
        with self.timed("reference"):
            return runner.run(scenario.payload(), top_k=self.opts.near_tie.top_k)

    @contextlib.contextmanager
    def timed(self, name: str) -> Iterator[None]:
        """Add the wall time of the block to ``timers[name]`` (the benchmark's split)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.timers[name] = self.timers.get(name, 0.0) + time.perf_counter() - t0

    def _call(self, cfg: EngineConfig, op: str, payload: Any) -> tuple[EngineHost, Any]:
        """One command on the engine of ``cfg``; a dead or hung engine is dropped, and the
        device it ran on is marked broken so later tests skip with this error."""
        from harness.engine_order import config_id

        self.test_configs.setdefault(self.current_test, config_id(cfg))
        if self.opts.plan_only:
            import pytest

            pytest.skip(f"plan only: recorded engine configuration {cfg.label}")
        try:
            with self.timed("engine_start"):
                host = self.pool.get(cfg)
        except EngineStartError as e:
            # A refusal the test expects (it asserts on it) is the device working as specified.
            if not (self.refusal_expected and isinstance(e, EngineRefused)):
                self._device_failed(cfg, e)
            raise
        if self.listeners:
            offset = host.log_path.stat().st_size if host.log_path.exists() else 0
            self._notify("engine", config=cfg, log_path=host.log_path, log_offset=offset)
        try:
            with self.timed("engine_calls"):
                result = host.call(op, payload, timeout=self.opts.call_timeout)
            if isinstance(result, dict) and "compute_seconds" in result:
                self.timers["engine_compute"] = (
                    self.timers.get("engine_compute", 0.0) + result["compute_seconds"])
            return host, result
        except (EngineCrashed, EngineTimeout) as e:
            self.pool.discard(cfg.key)
            self._device_failed(cfg, e)
            raise
        except EngineRequestError:
            raise
        except BaseException:
            # Interrupted mid-call (e.g. pytest-timeout): the engine's state is unknown.
            self.pool.discard(cfg.key)
            raise
        finally:
            self.pool.release(cfg)

    @contextlib.contextmanager
    def expect_refusal(self) -> Iterator[None]:
        """Within this block an engine that refuses to start (raises during start, process alive)
        does not mark its device broken; a crash or hang at start still does."""
        self.refusal_expected = True
        try:
            yield
        finally:
            self.refusal_expected = False

    def _device_failed(self, cfg: EngineConfig, error: Exception) -> None:
        if cfg.device and self.leases is not None:
            for lease in self.leases.held.values():
                if lease.device.id == cfg.device:
                    self.leases.mark_broken(lease.device, self.current_test, str(error))

    def generate(self, cfg: EngineConfig, scenario: Scenario) -> Trace:
        """Run every request of ``scenario`` in one engine call on the engine of ``cfg``."""
        self._notify("scenario", config=cfg, scenario=scenario)
        self.check_scenario(cfg, scenario)
        t0 = time.monotonic()
        host, result = self._call(
            cfg, "generate", {"requests": scenario.payload(), "logprobs": self.opts.near_tie.top_k}
        )
        trace = self._trace(cfg, host, result, generate_seconds=round(time.monotonic() - t0, 3))
        self._notify("trace", config=cfg, scenario=scenario, trace=trace)
        return trace

    def run_steps(self, cfg: EngineConfig, scenario: Scenario, probe: bool | None = None) -> Trace:
        """Drive ``scenario`` one engine step at a time, recording scheduler and KV state
        (the KV snapshots only when ``probe``, by default the session's ``kv_probe``)."""
        probe = self.opts.kv_probe if probe is None else probe
        self._notify("scenario", config=cfg, scenario=scenario)
        self.check_scenario(cfg, scenario)
        t0 = time.monotonic()
        host, result = self._call(
            cfg, "run_steps",
            {"requests": scenario.payload(), "logprobs": self.opts.near_tie.top_k, "probe": probe},
        )
        trace = self._trace(cfg, host, result, initial=result["initial"], idle=result["idle"],
                            run_seconds=round(time.monotonic() - t0, 3))
        trace.engine_steps = result["steps"]
        self._notify("trace", config=cfg, scenario=scenario, trace=trace)
        return trace

    @staticmethod
    def _trace(cfg: EngineConfig, host: EngineHost, result: dict[str, Any], **info: Any) -> Trace:
        """A Trace from an engine call's result, with the engine's info and ``info``."""
        trace = Trace(target=cfg.label, metrics=result["metrics"], info={**host.info, **info})
        for r in result["requests"]:
            trace.requests[r["request_id"]] = RequestTrace.from_dict(r)
        return trace

    def kv_snapshot(self, cfg: EngineConfig) -> list[dict[str, Any]]:
        """The engine's KV ledgers right now (after start-up: an idle point)."""
        snapshots = self._call(cfg, "kv_snapshot", None)[1]
        self._notify("kv_snapshot", config=cfg, snapshots=snapshots)
        return snapshots

    def ledger_report(self, trace: Trace) -> str | None:
        """None when every KV ledger invariant held at every step, else what broke."""
        from harness.kv import ledger_report

        with self.timed("checks"):
            report = ledger_report(trace.info.get("initial"), trace.engine_steps,
                                   bool(trace.info.get("idle")))
        self._notify("ledger", trace=trace, report=report)
        return report

    def compare(self, ref: Trace, dev: Trace, model: Model, scenario: Scenario) -> TraceComparison:
        """Token equality of ``dev`` against ``ref``; near-ties are kept for the run summary."""
        with self.timed("checks"):
            verdict = compare_traces(
                ref, dev, decode=model.decode,
                policy=card.near_tie_policy(self.opts.near_tie, dev.target, self.opts.near_tie_tol_sendnn),
                prompts=scenario.prompts_by_id()
            )
        for d in verdict.near_ties:
            self.near_ties.append(
                f"{dev.target} {scenario.name} request {d.request_id} position {d.position}"
            )
        self._notify("comparison", scenario=scenario, reference=ref, trace=dev, verdict=verdict)
        return verdict

    # -- bookkeeping --------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        return {
            "engines_started": len(self.pool.started),
            "engines": self.pool.started,
            "reference_hits": self.ref_cache.hits,
            "reference_misses": self.ref_cache.misses,
            "near_ties": self.near_ties,
            "timers": {k: round(v, 3) for k, v in self.timers.items()},
            "leases": [lease.describe() for lease in self.leases.held.values()] if self.leases else [],
            "cards": self.pool.cards.to_list(),
        }

    def write_stats(self, worker: str) -> Path:
        out = self.opts.reports_dir / "stats"
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{worker}.json"
        path.write_text(json.dumps(self.stats(), indent=1))
        return path

    def close(self) -> None:
        """Stop every engine, then give the leased devices back."""
        self.pool.close()
        if self.leases is not None:
            self.leases.release_all()
