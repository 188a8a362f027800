"""Fork parents started ahead: the configurations earlier runs recorded, the parents their
engines would fork from (one per parent, in test order, none for a device's engine or a stack
not installed), and a start that can only gain time, never fail a test."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from harness.core.config import EngineConfig, WarmupShape
from harness.engine import forkserver, prestart
from harness.engine.order import (
    CONFIGS,
    config_entry,
    config_id,
    planned_configs,
    save_configs,
    save_record,
)

CPU = EngineConfig(target="vllm-cpu", model="/m/tiny", max_model_len=256, max_num_seqs=4)
CPU_SMALL_POOL = CPU.with_(num_blocks_override=9)
SPYRE = EngineConfig(target="spyre", model="/m/tiny", max_model_len=256, max_num_seqs=4,
                     backend="eager", mode="cp", max_num_batched_tokens=128,
                     extra_env=(("VLLM_DT_MAX_BATCH_TKV_LIMIT", "512"),))


def record(cache: Path, tests: dict[str, EngineConfig]) -> None:
    entries = {config_id(c): config_entry(c) for c in tests.values()}
    save_record(cache, {n: config_id(c) for n, c in tests.items()})
    save_configs(cache, entries)


def test_a_configuration_comes_back_from_its_record_entry():
    sb = EngineConfig(target="spyre", model="/m", max_model_len=128, max_num_seqs=2,
                      backend="eager", mode="sb", warmup=WarmupShape(64, 20, 2),
                      faults=("perturb-logit:position=5",), stack="spyre-1.10")
    for cfg in (CPU, SPYRE, sb, CPU.with_(prefix_caching=False, tensor_parallel_size=2)):
        back = EngineConfig.from_dict(json.loads(json.dumps(config_entry(cfg))))
        assert back == cfg and back.key == cfg.key


def test_the_planned_configurations_are_the_recorded_ones_in_test_order_each_once(tmp_path):
    record(tmp_path, {"t::a": SPYRE, "t::b": CPU, "t::c": SPYRE, "t::d": CPU_SMALL_POOL})
    planned = planned_configs(tmp_path, ["t::b", "t::new", "t::c", "t::a", "t::d"],
                              stack="default")
    assert planned == [CPU, SPYRE, CPU_SMALL_POOL]  # t::new: never run, nothing planned
    assert planned_configs(tmp_path, [], stack="default") == []


def test_a_configuration_recorded_on_another_stack_is_planned_on_this_runs(tmp_path):
    # One test id on every stack: the record holds the last stack's; this run plans its own.
    record(tmp_path, {"t::a": CPU.with_(stack="legacy-spyre-0.4"), "t::b": SPYRE})
    assert planned_configs(tmp_path, ["t::a"], stack="default") == [CPU]
    # A configuration this run's stack does not have (sendnn-inference's pc mode on 1.x) is
    # left out, not planned as it was.
    pc = SPYRE.with_(mode="pc")
    record(tmp_path, {"t::c": pc})
    assert planned_configs(tmp_path, ["t::c"], stack="spyre-1.10") == []
    assert planned_configs(tmp_path, ["t::c"], stack="default") == [pc]


def test_a_device_is_not_part_of_the_recorded_configuration(tmp_path):
    record(tmp_path, {"t::a": CPU.with_(device="card0")})
    assert planned_configs(tmp_path, ["t::a"], stack="default") == [CPU]


@pytest.mark.parametrize("damage", [
    "not json",  # a damaged file
    '["a list"]',  # not an object
    '{"ID": {"target": "no-such-kind"}}',  # an entry no kind accepts any more
    '{"ID": {"target": "vllm-cpu"}}',  # an entry of an older shape
    '{"ID": "a string"}',
])
def test_a_damaged_record_plans_nothing_and_raises_nothing(tmp_path, damage):
    record(tmp_path, {"t::a": CPU})
    cid = config_id(CPU)
    (tmp_path / CONFIGS).write_text(damage.replace("ID", cid))
    assert planned_configs(tmp_path, ["t::a"], stack="default") == []
    record(tmp_path, {"t::a": CPU})  # the next run's record replaces it
    assert planned_configs(tmp_path, ["t::a"], stack="default") == [CPU]


def test_a_configs_record_that_is_a_folder_is_never_an_error(tmp_path):
    (tmp_path / CONFIGS).mkdir()
    record(tmp_path, {"t::a": CPU})  # written beside it: nothing raised, nothing planned
    assert (tmp_path / CONFIGS).is_dir()
    assert planned_configs(tmp_path, ["t::a"], stack="default") == []


def test_one_parent_per_environment_none_for_a_device_or_a_missing_stack():
    wants = prestart.parent_wants([CPU, CPU_SMALL_POOL, SPYRE, SPYRE.with_(max_num_seqs=2),
                                   CPU.with_(stack="no-such-stack"),
                                   SPYRE.with_(backend="sendnn", device="card0")])
    # The pool size and the batch TKV limit are the engine's own: one parent per kind.
    assert len(wants) == 2
    envs = [env for _, env in wants]
    assert envs[0]["VLLM_PLUGINS"] == "" and envs[1]["VLLM_PLUGINS"]
    # Exactly the environment an engine gets: this process's, the kind's on top.
    assert all(env["PATH"] == os.environ["PATH"] for env in envs)
    assert envs[0]["TORCH_COMPILE_DISABLE"] == "1"


@pytest.fixture
def one_thread(monkeypatch):
    """Engines of one thread each (two workers on two cores)."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(prestart, "cpu_share", lambda: 1)


def test_nothing_starts_ahead_without_a_share_or_forked_engines(tmp_path, monkeypatch, one_thread):
    monkeypatch.delenv(forkserver.SHARE_ENV, raising=False)
    assert prestart.start_ahead([CPU]) is None
    share = tmp_path / "share"
    share.mkdir(mode=0o700)
    monkeypatch.setenv(forkserver.SHARE_ENV, str(share))
    monkeypatch.setenv(forkserver.START_ENV, "fresh")
    assert prestart.start_ahead([CPU]) is None
    monkeypatch.setenv(forkserver.START_ENV, "platform")
    assert prestart.start_ahead([]) is None


def test_nothing_starts_ahead_of_engines_of_several_threads(tmp_path, monkeypatch):
    share = tmp_path / "share"
    share.mkdir(mode=0o700)
    monkeypatch.setenv(forkserver.SHARE_ENV, str(share))
    monkeypatch.setenv(forkserver.START_ENV, "platform")
    monkeypatch.setattr(forkserver, "ensure_shared", lambda *a: pytest.fail("started"))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(prestart, "cpu_share", lambda: 2)  # one process on two cores
    assert prestart.start_ahead([CPU]) is None
    monkeypatch.setattr(prestart, "cpu_share", lambda: None)  # the lab's threads
    for lab in ("4", "", "many"):
        monkeypatch.setenv("OMP_NUM_THREADS", lab)
        assert prestart.start_ahead([CPU]) is None
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setattr(forkserver, "ensure_shared", lambda *a: True)
    assert prestart.start_ahead([CPU]) is not None


def test_parents_start_in_order_in_a_thread_and_a_failure_is_no_error(tmp_path, monkeypatch,
                                                                     one_thread):
    share = tmp_path / "share"
    share.mkdir(mode=0o700)
    monkeypatch.setenv(forkserver.SHARE_ENV, str(share))
    monkeypatch.setenv(forkserver.START_ENV, "platform")
    started: list[str] = []

    def ensure(python, child_env, folder):
        started.append(child_env["VLLM_PLUGINS"])
        if len(started) == 1:
            raise forkserver.ForkServerError("exited (1) before it was ready")
        return True

    monkeypatch.setattr(forkserver, "ensure_shared", ensure)
    thread = prestart.start_ahead([CPU, SPYRE])
    assert isinstance(thread, threading.Thread) and thread.daemon
    thread.join(30)
    assert len(started) == 2 and started[0] == ""  # the first failed; the next still started


def test_ensure_shared_starts_only_a_parent_that_is_not_live(tmp_path, monkeypatch):
    share = tmp_path / "share"
    share.mkdir(mode=0o700)
    calls: list[str] = []

    def start(python, env, folder, key):
        calls.append(key)
        rec = {"pid": os.getpid(), "address": "a", "authkey": "00"}
        (folder / f"{key}.json").write_text(json.dumps(rec))
        return rec

    monkeypatch.setattr(forkserver, "_start_shared", start)
    env = {"PATH": os.environ["PATH"], "VLLM_PLUGINS": ""}
    assert forkserver.ensure_shared("/py", env, share) is True
    assert forkserver.ensure_shared("/py", env, share) is False  # live: nothing to start
    key = calls[0]
    (share / f"{key}.json").write_text(json.dumps({"error": "platform resolved"}))
    assert forkserver.ensure_shared("/py", env, share) is False  # unfit: the engine says why
    (share / f"{key}.json").write_text(json.dumps({"pid": 2 ** 22 + 12345}))
    assert forkserver.ensure_shared("/py", env, share) is True  # its parent is gone
    # The key is the engine's: per-engine variables (a test's own) do not change it.
    assert forkserver.shared_key("/py", {**env, "HIL_ENGINE_THREADS": "1"})[1] == key
    assert len(calls) == 2


class _Spawned(Exception):
    """Raised in place of an engine process: the environment it would have started with."""


@pytest.mark.parametrize("cfg", [CPU, SPYRE], ids=["vllm-cpu", "spyre-eager-cp"])
def test_the_parent_started_ahead_is_the_one_the_engine_start_asks_for(cfg, tmp_path,
                                                                        monkeypatch):
    from harness.engine import host
    from harness.engine.pool import EnginePool, PoolSettings

    def spawn(python, address, child_env, cwd, log_path, logfile):
        raise _Spawned(python, child_env)

    monkeypatch.setattr(host.forkserver, "spawn_engine", spawn)
    monkeypatch.setattr("harness.engine.pool.preflight_config", lambda cfg: None)
    with pytest.raises(_Spawned) as started:
        EnginePool(PoolSettings(reports_dir=tmp_path)).get(cfg)
    python, child_env = started.value.args
    ((ahead_python, ahead_env),) = prestart.parent_wants([cfg])
    assert ahead_python == python
    assert forkserver.shared_key(ahead_python, ahead_env) == forkserver.shared_key(python, child_env)
