"""Each process of a run computes with its share of the cores: the engines of side-by-side
workers, their ranks and the workers' reference models never ask for more threads than the
machine has; a lab's OMP_NUM_THREADS is its own."""

from __future__ import annotations

import os

import pytest

from harness.core import cpu_share


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    def set_up(cores: int, workers: int | None, lab: str | None = None) -> None:
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
        if workers is None:
            monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
        else:
            monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(workers))
        if lab is None:
            monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        else:
            monkeypatch.setenv("OMP_NUM_THREADS", lab)
    return set_up


def test_the_cores_are_shared_among_workers_and_ranks(machine) -> None:
    machine(2, 2)
    assert cpu_share.cpu_share() == 1
    assert cpu_share.cpu_share(ranks=2) == 1  # never below one
    machine(2, None)
    assert cpu_share.cpu_share() == 2  # one process alone takes the machine
    machine(8, 2)
    assert (cpu_share.cpu_share(), cpu_share.cpu_share(ranks=2)) == (4, 2)
    assert cpu_share.share_env(ranks=2) == {"HIL_ENGINE_THREADS": "2", "OMP_NUM_THREADS": "2"}
    machine(8, 2, lab="6")  # the lab's own: nothing set
    assert cpu_share.cpu_share() is None and cpu_share.share_env() == {}


def test_an_engine_takes_the_share_it_was_given(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    monkeypatch.delenv(cpu_share.THREADS_ENV, raising=False)
    assert cpu_share.take_share() is None and torch.get_num_threads() == before
    monkeypatch.setenv(cpu_share.THREADS_ENV, "1")
    try:
        assert cpu_share.take_share() == 1
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_every_engine_is_given_its_share_unless_the_lab_set_one(machine) -> None:
    from harness.core.config import EngineConfig
    from harness.targets import target_for

    cfg = EngineConfig(target="vllm-cpu", model="/m", max_model_len=256, max_num_seqs=4)
    machine(2, 2)
    env = target_for(cfg).engine_env()
    assert env["HIL_ENGINE_THREADS"] == "1" and env["OMP_NUM_THREADS"] == "1"
    machine(2, 2, lab="2")
    env = target_for(cfg).engine_env()
    assert "HIL_ENGINE_THREADS" not in env and "OMP_NUM_THREADS" not in env
