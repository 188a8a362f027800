"""EnginePool: one live engine per EngineConfig in this pytest process.

Engines are expensive to start, so tests with equal configurations share one;
the least recently used engine is stopped when too many are live. A
configuration whose engine failed to start is remembered, so later tests with
it fail at once with the original error instead of starting it again.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.checks.capacity import CapacityError, check_capacity, preflight_config
from harness.core.config import EngineConfig
from harness.core.errors import DeviceMismatch, EngineError, EngineStartError
from harness.engine.bind_retry import start_with_free_ports
from harness.engine.device_ledger import DeviceLedger
from harness.engine.host import START_TIMEOUT, EngineHost, engine_log_path, log_since
from harness.in_engine.faults import FAULT_STATE_ENV
from harness.stacks import host as host_stack
from harness.stacks.spec import load_stack, stack_python
from harness.targets import target_for
from harness.targets.base import VllmTarget

MAX_LIVE_ENGINES = 3  # engines kept alive at once per pytest process (--max-live-engines)


@dataclass(frozen=True)
class EngineStart:
    """One engine this pool started: which configuration, and how long it took."""

    config: str
    key: str
    seconds: float


@dataclass(frozen=True)
class PoolSettings:
    """What the pool needs from the session options."""

    reports_dir: Path
    max_live_engines: int = MAX_LIVE_ENGINES
    start_timeout: float | None = None  # None: the kind's for the configuration (start_timeout)
    engine_reuse: bool = True
    # Where each engine gets a scratch working directory of its own (a runtime writes relative
    # files there); None: a temporary folder per engine.
    work_dir: Path | None = None


def stack_runtime(cfg: EngineConfig) -> tuple[str | None, dict[str, str], dict[str, Any]]:
    """The python, environment and LLM arguments the engine's stack adds (none for default)."""
    if cfg.stack == "default":
        return None, {}, {}
    if cfg.stack == host_stack.HOST:
        return host_stack.host_python(), {}, {}

    stack = load_stack(cfg.stack)
    python = stack_python(cfg.stack)
    if python is None:
        raise EngineStartError(
            f"stack {cfg.stack} is not installed (or its pins changed): run ./setup.sh --stack {cfg.stack}"
        )
    env = {**stack.env, **stack.target_env.get(cfg.variant_id, {})}
    return str(python), env, dict(stack.engine)


def engine_env(cfg: EngineConfig, target: VllmTarget, stack_env: dict[str, str]) -> dict[str, str]:
    """The variables the engine of ``cfg`` is given on top of the inherited environment: its
    kind's, its stack's, then the configuration's own."""
    return {**target.engine_env(), **stack_env, **dict(cfg.extra_env)}


def engine_kwargs(cfg: EngineConfig, target: VllmTarget,
                  stack_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The ``vllm.LLM`` arguments of ``cfg``: its target's, its stack's, then what the
    configuration turns over itself (``prefix_caching``)."""
    kwargs = {**target.llm_kwargs(), **stack_kwargs}
    if cfg.prefix_caching is not None:
        kwargs["enable_prefix_caching"] = cfg.prefix_caching
    return kwargs


def prefix_caching_on(cfg: EngineConfig) -> bool:
    """Whether the engine of ``cfg`` caches prefixes (what its target, mode and stack choose,
    unless the configuration says)."""
    _, _, stack_kwargs = stack_runtime(cfg)
    return bool(engine_kwargs(cfg, target_for(cfg), stack_kwargs).get("enable_prefix_caching"))


def start_timeout(target: VllmTarget, option: float | None) -> float:
    """The engine-start limit: ``--engine-start-timeout`` when given, else the kind's for this
    configuration (a card compiles at start), else ``START_TIMEOUT``."""
    if option:
        return float(option)
    return target.start_timeout() or START_TIMEOUT


def ranks_problem(cfg: EngineConfig, info: dict[str, Any]) -> str | None:
    """Why the started engine does not run the ranks ``cfg`` asked for (its world size, each
    rank answering once from a process of its own), or None. An engine reporting no ranks
    (ranks the harness did not start, as a Neuron inventory's own tensor_parallel_size) is not
    judged."""
    want = cfg.tensor_parallel_size
    ranks = info.get("ranks")
    if ranks is None:
        return None
    numbers = [r.get("rank") for r in ranks]
    if info.get("world_size") != want or numbers != list(range(want)):
        return (f"asked for tensor_parallel_size {want}, but the engine runs world size"
                f" {info.get('world_size')} with ranks {numbers} answering")
    pids = [r.get("pid") for r in ranks]
    if want > 1 and (len(set(pids)) != want or info.get("pid") in pids):
        return (f"asked for {want} ranks in processes of their own, but they answered from"
                f" processes {pids} (the engine process is {info.get('pid')})")
    return None


class EnginePool:
    """One live EngineHost per EngineConfig, least recently used evicted first."""

    def __init__(self, settings: PoolSettings) -> None:
        self.settings = settings
        self._live: OrderedDict[str, EngineHost] = OrderedDict()
        self._failed: dict[str, EngineError] = {}
        self.started: list[EngineStart] = []
        self.device_ledger = DeviceLedger()  # starts and stops per whole device (one engine per card)
        self._fault_state: str | None = None  # what faults keep across this process's engines
        # Why engines start now, when not for a test (``triage``): recorded with each card start.
        self.purpose: str | None = None

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
        target = target_for(cfg)
        holds_device = target.holds_device()
        if holds_device:  # a card cannot load two models at once
            for other in self.device_ledger.live_on(str(cfg.device)):
                self.discard(other)
        while len(self._live) >= max(1, self.settings.max_live_engines):
            self.discard(next(iter(self._live)))
        python, stack_env, stack_kwargs = stack_runtime(cfg)
        try:
            if not target.refuses_small_pool:
                preflight_config(cfg)
        except CapacityError as e:
            self._failed[key] = e
            raise
        try:
            env = engine_env(cfg, target, stack_env)
            env[FAULT_STATE_ENV] = self.fault_state_dir()
            llm_kwargs = engine_kwargs(cfg, target, stack_kwargs)
            log_dir = self.settings.reports_dir / "engine-logs"
            # A start that found a port taken (another run's) is started again with others.
            host = start_with_free_ports(lambda ports_env: EngineHost(
                cfg,
                {**env, **ports_env},
                llm_kwargs,
                log_dir,
                start_timeout=start_timeout(target, self.settings.start_timeout),
                python=python,
                work_dir=self.settings.work_dir,
            ), engine_log_path(log_dir, cfg), cfg.label)
        except EngineError as e:
            if holds_device:
                self.device_ledger.started(cfg, ok=False, purpose=self.purpose)
            self._failed[key] = e
            raise
        if holds_device:
            self.device_ledger.started(cfg, purpose=self.purpose)
        problem = target.verify_device(host.info, log_since(host.log_path, host.log_offset))
        if problem:
            tail = host.log_tail()
            self._close(key, host)
            self._failed[key] = DeviceMismatch(problem, tail)
            raise self._failed[key]
        try:
            check_capacity(cfg, host.info)
        except CapacityError as e:
            self._close(key, host)
            self._failed[key] = e
            raise
        problem = ranks_problem(cfg, host.info) or target.check_started(host.info)
        if problem:  # the engine runs, but not as this target asked (platform, cores, blocks)
            self._close(key, host)
            self._failed[key] = EngineStartError(f"{cfg.label}: {problem}")
            raise self._failed[key]
        self.started.append(EngineStart(cfg.label, key, round(host.start_seconds, 2)))
        self._live[key] = host
        return host

    def was_started(self, cfg: EngineConfig) -> bool:
        """Whether an engine of ``cfg`` was started by this pool (now live or not)."""
        return any(s.key == cfg.key for s in self.started)

    def fault_state_dir(self) -> str:
        """A folder faults may keep state in across this process's engines (e.g. to fire once
        per run, not once per engine); removed when the pool closes."""
        if self._fault_state is None:
            self._fault_state = tempfile.mkdtemp(prefix="hil-fault-state-")
        return self._fault_state

    def replace(self, cfg: EngineConfig) -> EngineHost:
        """Stop the live engine of ``cfg`` and start a fresh one (a dirty engine's replacement;
        on a card it is recorded as such, not as a second start of the configuration)."""
        self.discard(cfg.key)
        host = self.get(cfg)
        if target_for(cfg).holds_device():
            self.device_ledger.mark_replacement(cfg.key)
        return host

    def release(self, cfg: EngineConfig) -> None:
        """Stop the engine of ``cfg`` unless engines are reused across tests."""
        if not self.settings.engine_reuse:
            self.discard(cfg.key)

    def discard_device(self, device: str) -> None:
        """Stop every live engine on ``device`` (a lease of it is about to be let go)."""
        for key in [k for k, h in self._live.items() if h.cfg.device == device]:
            self.discard(key)

    def discard(self, key: str) -> None:
        host = self._live.pop(key, None)
        if host is not None:
            self._close(key, host)

    def _close(self, key: str, host: EngineHost) -> None:
        host.close()
        self.device_ledger.closed(key)

    def close(self) -> None:
        for key in list(self._live):
            self.discard(key)
        if self._fault_state is not None:
            shutil.rmtree(self._fault_state, ignore_errors=True)
            self._fault_state = None
