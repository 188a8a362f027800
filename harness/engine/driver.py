"""EngineDriver: sends scenarios to engines and turns their answers into Traces.

Owns the engine-failure policy: a dead or hung engine is dropped from the pool
and the device it ran on is reported (``on_device_failed``) so later tests on it
skip; a call interrupted mid-way (e.g. pytest-timeout) drops the engine too,
since its state is unknown.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.checks.capacity import KvPool
from harness.core.comparison import NEAR_TIE_TOP_K
from harness.core.config import ConfigError, EngineConfig
from harness.core.errors import EngineCrashed, EngineRequestError, EngineStartError, EngineTimeout
from harness.core.serialise import snapshot_from_dict, trace_from_dict
from harness.core.trace import KvSnapshot, Trace
from harness.engine.host import CALL_TIMEOUT, EngineHost
from harness.engine.hygiene import EngineHygiene
from harness.engine.pool import EnginePool
from harness.scenario.prompts import Scenario
from harness.session.listeners import SessionListener
from harness.session.stats import Timers
from harness.targets import target_for


@dataclass(frozen=True)
class DriverSettings:
    call_timeout: float = CALL_TIMEOUT
    top_k: int = NEAR_TIE_TOP_K  # logprobs recorded per position (the near-tie rule's top_k)
    kv_probe: bool = True


class EngineDriver:
    """Runs scenarios on the engines of an EnginePool."""

    def __init__(
        self,
        pool: EnginePool,
        settings: DriverSettings,
        timers: Timers,
        listener: SessionListener,
        on_device_failed: Callable[[EngineConfig, Exception], None],
        before_call: Callable[[EngineConfig], None] | None = None,
    ) -> None:
        self.pool = pool
        self.settings = settings
        self.timers = timers
        self.listener = listener
        self.on_device_failed = on_device_failed
        self.before_call = before_call  # e.g. records the test's configuration (test order)
        # Checks an engine handed from one test to the next (harness.engine.hygiene).
        self.hygiene: EngineHygiene | None = None

    @staticmethod
    def check_scenario(cfg: EngineConfig, scenario: Scenario) -> None:
        """Refuse requests the engine would refuse, before any engine starts."""
        target = target_for(cfg)
        for r in scenario.requests:
            try:
                target.check_request(len(r.prompt_token_ids), r.max_tokens)
            except ConfigError as e:
                raise ConfigError(f"scenario {scenario.name}, request {r.request_id}: {e}") from None

    def _start(self, cfg: EngineConfig) -> EngineHost:
        """The live engine of ``cfg`` (started if needed); a start error reports the device."""
        if self.before_call is not None:
            self.before_call(cfg)
        try:
            with self.timers.timed("engine_start"):
                if self.hygiene is not None:
                    return self.hygiene.engine_for(cfg, self.pool)
                return self.pool.get(cfg)
        except EngineStartError as e:
            self.on_device_failed(cfg, e)
            raise

    def _call(self, cfg: EngineConfig, op: str, payload: Any) -> tuple[EngineHost, Any]:
        """One command on the engine of ``cfg``; a dead or hung engine is dropped, and the
        device it ran on is reported broken so later tests skip with this error."""
        host = self._start(cfg)
        if self.hygiene is not None:
            self.hygiene.calling(cfg)
        offset = host.log_path.stat().st_size if host.log_path.exists() else 0
        self.listener.on_engine(cfg, host.log_path, offset)
        try:
            with self.timers.timed("engine_calls"):
                result = host.call(op, payload, timeout=self.settings.call_timeout)
            if isinstance(result, dict) and "compute_seconds" in result:
                self.timers.add("engine_compute", result["compute_seconds"])
            return host, result
        except (EngineCrashed, EngineTimeout) as e:
            self.pool.discard(cfg.key)
            self.on_device_failed(cfg, e)
            raise
        except EngineRequestError:
            raise
        except BaseException:
            # Interrupted mid-call (e.g. pytest-timeout): the engine's state is unknown.
            self.pool.discard(cfg.key)
            raise
        finally:
            self.pool.release(cfg)

    def _run(self, cfg: EngineConfig, scenario: Scenario, op: str, payload: dict[str, Any]) -> Trace:
        self.listener.on_scenario(cfg, scenario)
        self.check_scenario(cfg, scenario)
        t0 = time.monotonic()
        host, result = self._call(cfg, op, {"requests": scenario.payload(),
                                            "logprobs": self.settings.top_k, **payload})
        trace = trace_from_dict(result["trace"])
        trace.target = cfg.label
        timing = "generate_seconds" if op == "generate" else "run_seconds"
        trace.info = {**host.info, timing: round(time.monotonic() - t0, 3)}
        if "probe" in result:  # engine-side KV probe time of a step-driven run
            trace.info["probe"] = result["probe"]
        if self.hygiene is not None:
            self.hygiene.after_trace(cfg, trace)
        self.listener.on_trace(cfg, scenario, trace)
        return trace

    def generate(self, cfg: EngineConfig, scenario: Scenario,
                 teacher: Trace | None = None) -> Trace:
        """Every request of ``scenario`` in one engine call; with ``teacher`` (the reference),
        the same call also runs every request teacher-forced (``Trace.forced``)."""
        extra = {} if teacher is None else {
            "teacher": {rid: r.token_ids for rid, r in teacher.requests.items()}}
        return self._run(cfg, scenario, "generate", extra)

    def run_steps(self, cfg: EngineConfig, scenario: Scenario, probe: bool | None = None) -> Trace:
        """``scenario`` one engine step at a time, recording a StepRecord per step (with KV
        snapshots only when ``probe``, by default the driver's ``kv_probe``)."""
        probe = self.settings.kv_probe if probe is None else probe
        return self._run(cfg, scenario, "run_steps", {"probe": probe})

    def kv_snapshot(self, cfg: EngineConfig) -> list[KvSnapshot]:
        """The engine's KV ledgers right now (after start-up: an idle point)."""
        snapshots = [snapshot_from_dict(d) for d in self._call(cfg, "kv_snapshot", None)[1]]
        if self.hygiene is not None:
            self.hygiene.after_snapshots(cfg, snapshots)
        self.listener.on_kv_snapshot(cfg, snapshots)
        return snapshots

    def probe_idle(self, host: EngineHost) -> list[KvSnapshot]:
        """The KV ledgers of ``host`` read directly (the hygiene check: no test call)."""
        with self.timers.timed("engine_hygiene"):
            answer = host.call("kv_snapshot", None, timeout=self.settings.call_timeout)
        return [snapshot_from_dict(d) for d in answer]

    def kv_pool(self, cfg: EngineConfig) -> KvPool:
        """The KV pool the engine of ``cfg`` decided on at start (starting it if needed)."""
        host = self._start(cfg)
        pool = KvPool.from_engine_info(host.info)
        if pool is None:
            raise EngineRequestError(
                f"engine {cfg.label} reported no KV pool: {host.info.get('kv_error', 'no ledger')}"
            )
        return pool
