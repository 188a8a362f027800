"""The fault registry: ``FAULTS`` (name -> function), filled where each fault is defined.

A fault module names each fault once, with ``@fault("NAME")``; this module also holds what
every fault shares: the arming switch (faults stay dormant through engine start-up),
``Once`` (the guard of a fault that fires once) and the target hooks through which a
kind's fault module adapts a generic fault to its runner. Nothing here imports vLLM, nor
the faults package (``harness.in_engine.faults``) that loads every fault module: a kind's
fault module imports this one, and that package imports the kind's module by name.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

FaultFn = Callable[..., None]
F = TypeVar("F", bound=Callable[..., Any])

FAULTS: dict[str, FaultFn] = {}
FAULT_STATE_ENV = "HIL_FAULT_STATE_DIR"  # set by the engine pool: one folder per pytest process

# Faults stay dormant through engine start-up (warmup, profiling) until armed.
_armed = {"on": False}


def arm() -> None:
    """Let installed faults fire from now on (called once the engine has started)."""
    _armed["on"] = True


def armed() -> bool:
    return _armed["on"]


def fault(name: str) -> Callable[[F], F]:
    """Register the decorated function as the fault ``name`` (its spec name, e.g.
    ``forget-free``); it is called as ``fn(config, **spec_arguments)`` before vLLM starts."""

    def register(fn: F) -> F:
        if name in FAULTS:
            raise ValueError(f"fault {name!r} is registered twice ({FAULTS[name].__module__}"
                             f" and {fn.__module__})")
        FAULTS[name] = fn
        return fn

    return register


class Once:
    """The guard of a fault that fires once: at its ``after``-th chance (0-based) once armed.

    ``due()`` counts a chance and says whether this one is it; the fault then does its
    damage and calls ``fire(line)`` (or lets the chance pass: the next one is due again).
    The guard lives as long as the installed patch, so each engine process fires once;
    with ``state_key`` it is kept in the run's fault-state folder (``$HIL_FAULT_STATE_DIR``,
    one per pytest process) instead, so a replacement engine started later does not fire.
    """

    def __init__(self, after: int | str = 0, state_key: str | None = None) -> None:
        self.after = int(after)
        self.chances = 0
        folder = os.environ.get(FAULT_STATE_ENV)
        self._marker = Path(folder) / f"{state_key}.fired" if state_key and folder else None
        self.fired = self._marker is not None and self._marker.exists()

    def due(self) -> bool:
        """True at the ``after``-th chance while armed and not fired yet."""
        if not armed() or self.fired:
            return False
        if self.chances == self.after:
            return True
        self.chances += 1
        return False

    def fire(self, line: str) -> None:
        """Mark the fault fired and print ``line`` (its ``[hil] fault`` log line)."""
        self.fired = True
        if self._marker is not None:
            self._marker.touch()
        print(line, flush=True)


# A kind's part of a generic fault: (hook, target) -> function(config) -> value.
LEDGER_POOL = "ledger-pool"  # -> predicate(pool): is this the pool of a request's real blocks
RUNNER_PREEMPTION = "runner-preemption"  # gives the runner a path for vLLM's preemptions
_HOOKS: dict[tuple[str, str], Callable[[dict[str, Any]], Any]] = {}


def target_hook(hook: str, target: str) -> Callable[[F], F]:
    """Register the decorated function as ``target``'s part of the generic faults using ``hook``."""

    def register(fn: F) -> F:
        _HOOKS[(hook, target)] = fn
        return fn

    return register


def run_target_hook(hook: str, config: dict[str, Any]) -> Any:
    """The engine's target's ``hook`` called with ``config``; None where the target has none."""
    fn = _HOOKS.get((hook, str(config.get("target"))))
    return None if fn is None else fn(config)
