"""Shared fork parents started ahead of the tests that need them.

Each environment's shared parent (``harness.engine.forkserver``) imports torch and vLLM once,
8-15 s of one core, and used to start when the first engine of that environment was asked for:
the test waited, and a second worker asking for it too waited as long. A session that knows
its tests (after collection) starts, in a thread of its own, the parents its engines will
fork from, one after another in the order the tests run: while the first tests run on one
parent the next one imports on the other core. An engine that comes before its parent is
ready waits for the same lock and then only connects, as it would have after starting it.

Only where each engine computes with one thread (``harness.core.cpu_share``: as many workers as
cores, or a lab's ``OMP_NUM_THREADS=1``): such an engine loses to a start beside it only the
share of a core the start takes, while an engine of several threads waits at every parallel
region for the one the start pushed off its core (measured on 2 cores, one process, a parent
starting beside: a suite's forward passes 20.7 s with engines of two threads, 13.9 s with
engines of one, equal with nothing beside; with two workers and engines of one thread the
mission suite took 74 s instead of 83 s). docs/engines.md has the figures.

What is started is exactly what an engine start would start: the parent's environment is
computed as the engine's (its kind's, its stack's and the configuration's variables on top
of this process's), so its key is the engine's. Only where parents are shared (a run of this
checkout: ``HIL_FORKSERVER_SHARE``) and engines fork from them (``HIL_ENGINE_START`` platform);
never for an engine that holds a device (its environment is the lease's, made at the start),
and never an error: a parent that cannot be started here is started, or refused with its
reason, by the engine that needs it.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from harness.core.config import EngineConfig
from harness.core.cpu_share import LAB_THREADS_ENV, cpu_share
from harness.engine import forkserver
from harness.engine.host import engine_process_env
from harness.engine.pool import engine_env, stack_runtime
from harness.targets import target_for

log = logging.getLogger("harness.engine")


def parent_wants(cfgs: Iterable[EngineConfig]) -> list[tuple[str, dict[str, str]]]:
    """(python, engine environment) of each configuration whose engine forks from a shared
    parent, first come first, one per parent."""
    wants: list[tuple[str, dict[str, str]]] = []
    seen: set[str] = set()
    for cfg in cfgs:
        try:
            target = target_for(cfg)
            if target.holds_device():
                continue
            python, stack_env, _ = stack_runtime(cfg)
            child_env = engine_process_env(engine_env(cfg, target, stack_env))
        except Exception as e:  # a stack not installed, a kind refusing: the engine says why
            log.debug("no parent started ahead for %s: %s", cfg.label, e)
            continue
        python = python or sys.executable
        _, key = forkserver.shared_key(python, child_env)
        if key not in seen:
            seen.add(key)
            wants.append((python, child_env))
    return wants


def start_ahead(cfgs: Iterable[EngineConfig]) -> threading.Thread | None:
    """Start the shared parents of ``cfgs``'s engines in a background thread (None: nothing
    to start here, parents not shared or engines not forked from them)."""
    if forkserver.start_mode() != "platform" or engine_threads() != 1:
        return None
    folder = forkserver.share_folder()
    if folder is None:
        return None
    wants = parent_wants(cfgs)
    if not wants:
        return None
    thread = threading.Thread(target=_start_all, args=(wants, folder), daemon=True,
                              name="hil-parents-ahead")
    thread.start()
    return thread


def engine_threads() -> int | None:
    """The threads a one-rank engine of this process computes with (the lab's where it set
    ``OMP_NUM_THREADS``; None where that is not a number)."""
    share = cpu_share()
    if share is not None:
        return share
    try:
        return int(os.environ.get(LAB_THREADS_ENV, ""))
    except ValueError:
        return None


def _start_all(wants: list[tuple[str, dict[str, str]]], folder: Path) -> None:
    for python, child_env in wants:
        t0 = time.monotonic()
        try:
            if forkserver.ensure_shared(python, child_env, folder):
                log.info("shared fork parent started ahead in %.1f s", time.monotonic() - t0)
        except Exception as e:  # the engine that needs it starts it, or says why it cannot
            log.debug("shared fork parent not started ahead: %s", e)
