"""The threads a process of this run computes with: its share of the machine's cores.

Every engine of a run, and every pytest worker's reference model, computes with torch, whose
thread pool is as large as the machine (OpenMP's default). Run side by side (pytest-xdist
workers, each with its engine), those pools ask for more threads than there are cores: their
threads wait for one another at every parallel region, and a tiny model's step, a few
milliseconds of work, takes tens of times longer (measured: 4 requests x 150 tokens of a tiny
Llama in 0.35 s with one thread, 8-15 s with the default two, on two cores with a second
worker busy). So each process takes its share: the cores this process may run on, divided
among the run's concurrent workers and an engine's ranks. A lab that sets ``OMP_NUM_THREADS``
keeps its own: the harness then sets nothing.
"""

from __future__ import annotations

import os

# What an engine process is told to compute with (set by the host, read in the engine).
THREADS_ENV = "HIL_ENGINE_THREADS"
LAB_THREADS_ENV = "OMP_NUM_THREADS"


def cores() -> list[int]:
    """The cores this process may run on (all of them where the platform cannot say)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def usable_cores() -> int:
    """How many cores this process may run on."""
    return len(cores())


def concurrent_workers() -> int:
    """The pytest workers of this run computing side by side (1 without xdist)."""
    try:
        return max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    except ValueError:
        return 1


def cpu_share(ranks: int = 1) -> int | None:
    """Threads for each of ``ranks`` processes of one worker's engine (at least one); None
    where the lab sets ``OMP_NUM_THREADS`` itself."""
    if os.environ.get(LAB_THREADS_ENV):
        return None
    return max(1, usable_cores() // (concurrent_workers() * max(1, ranks)))


def share_env(ranks: int = 1) -> dict[str, str]:
    """The variables that give an engine of ``ranks`` ranks its share: the harness's own (the
    engine applies it to its torch before it builds the model) and ``OMP_NUM_THREADS`` for the
    processes it starts (a rank's runtime reads it when it starts); {} where the lab set it."""
    share = cpu_share(ranks)
    if share is None:
        return {}
    return {THREADS_ENV: str(share), LAB_THREADS_ENV: str(share)}


def take_share() -> int | None:
    """In an engine process: compute with the threads the host gave it (``THREADS_ENV``);
    returns them, or None where it gave none."""
    value = os.environ.get(THREADS_ENV)
    if not value:
        return None
    return use_threads(int(value))


def use_threads(threads: int) -> int:
    """Set this process's torch to ``threads`` threads (at least one); returns them."""
    import torch

    threads = max(1, threads)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads
