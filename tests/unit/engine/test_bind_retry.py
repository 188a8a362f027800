"""An engine start refused because a port it binds was taken is started again with other
ports, a bounded number of times; any other failure is the start's own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.core.config import EngineConfig
from harness.core.errors import EngineRefused, EngineStartError
from harness.core.ports import AVOID_ENV, BIND_PORTS_ENV, PICKED_LINE
from harness.engine import pool as pool_module
from harness.engine.bind_retry import BIND_ATTEMPTS, RESTART_LINE, start_with_free_ports
from harness.engine.host import engine_log_path
from harness.engine.pool import EnginePool, PoolSettings
from harness.targets.spyre.generations import for_stack
from tests.unit.core.test_ports import DIST_NETWORK_ERROR

SPYRE = EngineConfig(target="spyre", model="/m/tiny", max_model_len=256, max_num_seqs=4,
                     backend="eager", mode="np", max_num_batched_tokens=128)


def refused(label: str) -> EngineRefused:
    """The error a Spyre engine's start gave when its MASTER_PORT was taken (EngineHost)."""
    return EngineRefused(
        f"engine {label} failed to start with model /m/tiny: DistNetworkError:"
        f" {DIST_NETWORK_ERROR} (check that the folder loads with transformers and that spyre"
        " supports its architecture)",
        "torch.distributed.DistNetworkError: " + DIST_NETWORK_ERROR,
        error_type="DistNetworkError")


class FakeStarts:
    """Engine starts that each log the port picked, the first ``fail`` of them refused."""

    def __init__(self, log: Path, fail: int, error: Any = refused) -> None:
        self.log, self.fail, self.error = log, fail, error
        self.envs: list[dict[str, str]] = []

    def __call__(self, env: dict[str, str]) -> str:
        self.envs.append(env)
        port = 20000 + len(self.envs)
        with open(self.log, "a") as f:
            f.write(f"{PICKED_LINE} MASTER_PORT={port}\n")
        if len(self.envs) <= self.fail:
            raise self.error("spyre-eager-np")
        return f"engine on {port}"


def test_a_start_refused_with_eaddrinuse_is_started_again_with_another_port(tmp_path):
    log = tmp_path / "engine.log"
    starts = FakeStarts(log, fail=1)
    assert start_with_free_ports(starts, log, "spyre-eager-np") == "engine on 20002"
    assert starts.envs == [{}, {AVOID_ENV: "20001"}]  # the taken port is never picked again
    assert (f"{RESTART_LINE} start refused, an address it binds was in use (ports picked:"
            " 20001); starting it again with other ports (start 2 of 3)") in log.read_text()


def test_the_restarts_are_bounded_and_the_last_refusal_is_raised(tmp_path):
    log = tmp_path / "engine.log"
    starts = FakeStarts(log, fail=BIND_ATTEMPTS)
    with pytest.raises(EngineRefused, match="EADDRINUSE"):
        start_with_free_ports(starts, log, "spyre-eager-np")
    assert starts.envs[-1] == {AVOID_ENV: "20001,20002"} and len(starts.envs) == BIND_ATTEMPTS


def test_an_address_in_use_only_in_the_log_counts_and_an_earlier_starts_log_does_not(tmp_path):
    # A rank's refusal reaches the host as the engine core's ("Engine core initialization
    # failed"): its own log says why. A start's log is its own part of the file.
    log = tmp_path / "engine.log"
    log.write_text(f"an earlier start: {DIST_NETWORK_ERROR}\n")

    def died(label: str) -> EngineStartError:
        return EngineStartError(f"engine {label} died with exit code 1 while starting")

    starts = FakeStarts(log, fail=1, error=died)
    with pytest.raises(EngineStartError):
        start_with_free_ports(starts, log, "spyre-eager-np")
    assert len(starts.envs) == 1

    def rank_died(label: str) -> EngineStartError:
        with open(log, "a") as f:
            f.write(f"(Worker_TP0) torch.distributed.DistNetworkError: {DIST_NETWORK_ERROR}\n")
        return EngineRefused(f"engine {label} failed to start: RuntimeError: Engine core"
                             " initialization failed. See root cause above.")

    starts = FakeStarts(log, fail=1, error=rank_died)
    assert start_with_free_ports(starts, log, "spyre-eager-cp-tp2") == "engine on 20002"


def test_a_refusal_of_the_configuration_is_not_retried(tmp_path):
    log = tmp_path / "engine.log"

    def pool_too_small(label: str) -> EngineRefused:
        return EngineRefused(f"engine {label} failed: ValueError: Number of pages available on"
                             " Spyre (3) is not enough", error_type="ValueError")

    starts = FakeStarts(log, fail=1, error=pool_too_small)
    with pytest.raises(EngineRefused, match="Number of pages"):
        start_with_free_ports(starts, log, "spyre-eager-np")
    assert len(starts.envs) == 1


def test_the_pool_gives_a_test_the_engine_restarted_after_its_port_was_taken(tmp_path,
                                                                              monkeypatch):
    """The issue's red: every spyre-eager-np start refused with DistNetworkError EADDRINUSE on
    the MASTER_PORT the harness had picked; the pool now starts the engine again."""
    gen = for_stack("default")
    assert gen is not None
    module, _, cls = gen.platform_class.rpartition(".")
    envs: list[dict[str, str]] = []

    class Host:
        alive = True

        def __init__(self, cfg: EngineConfig, env: dict[str, str], llm_kwargs: Any,
                     log_dir: Path, **_: Any) -> None:
            envs.append(env)
            self.cfg, self.log_path, self.log_offset = cfg, engine_log_path(log_dir, cfg), 0
            log_dir.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "a") as f:
                f.write(f"{PICKED_LINE} MASTER_PORT={20000 + len(envs)}\n")
            if len(envs) == 1:
                raise refused(cfg.label)
            self.start_seconds = 0.1
            self.info = {"platform_module": module, "platform": cls, "plugins": gen.plugin}

        def log_tail(self) -> str:
            return ""

        def close(self) -> None:
            pass

    monkeypatch.setattr(pool_module, "EngineHost", Host)
    pool = EnginePool(PoolSettings(reports_dir=tmp_path))
    host = pool.get(SPYRE)
    assert isinstance(host, Host) and len(envs) == 2
    # The harness picks no port ahead: the engine process picks MASTER_PORT as it starts.
    assert envs[0][BIND_PORTS_ENV] == "MASTER_PORT" and "MASTER_PORT" not in envs[0]
    assert envs[1][AVOID_ENV] == "20001"
    assert [s.config for s in pool.started] == [SPYRE.label]


def test_no_port_is_chosen_ahead_so_none_keys_a_parent_or_differs_between_starts():
    """Two starts of one configuration are given the same environment (the harness used to put
    a port of its choosing in each), and a port in an engine's environment keys no parent."""
    from harness.engine import forkserver
    from harness.targets import target_for

    first, second = (target_for(SPYRE).engine_env() for _ in range(2))
    assert first == second and "MASTER_PORT" not in first
    assert first[BIND_PORTS_ENV] == "MASTER_PORT"
    with_ports = [{**first, "MASTER_PORT": p, AVOID_ENV: p} for p in ("20001", "20002")]
    keys = {forkserver.shared_key("python", env)[1] for env in with_ports}
    assert len(keys) == 1
    assert len({forkserver.platform_key(env) for env in with_ports}) == 1
    assert not any(k.startswith(("MASTER_", "HIL_")) for k in forkserver.parent_env(first, {}))
