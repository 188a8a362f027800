"""The ranks of a tensor-parallel engine, seen from inside their own processes.

vLLM runs each rank of a tensor-parallel engine in a process of its own (its multiprocess
executor; on the CPU the ranks are spawned, so nothing the engine process patched reaches
them). Every rank's worker mixes in ``RankExtension`` (vLLM's ``worker_extension_cls``, named by
``harness.targets.declarations.RANK_EXTENSION``), which vLLM imports in the rank's process
before the rank builds its worker and model. That import installs the engine's faults and its
kind's ledger readers there, from the engine configuration the engine process left in its
environment (``share_with_ranks``), so a fault reaches the rank whose code it patches.

A fault that names a rank (``rank=N``, ``harness.in_engine.faults``) is installed in that rank
only, when the engine process arms its faults after start (``arm_ranks``): the rank a process
is becomes known there. The engine process asks its ranks through vLLM's ``collective_rpc``:
who they are (``hil_rank``), what their model runner holds (``hil_runner_facts``: the block
table, the KV cache's block count and the prefix-cache use that one rank's runner reads for
the KV ledgers) and to arm their faults (``hil_arm``).
"""

from __future__ import annotations

import json
import os
from typing import Any

from harness.in_engine import faults
from harness.in_engine.kind_modules import KindModules, import_modules
from harness.in_engine.probes import rank_runner_facts

# The engine configuration (JSON) the ranks install faults and readers from, and the pid of
# the engine process that set it (which installed them itself already).
RANK_CONFIG_ENV = "HIL_RANK_ENGINE_CONFIG"
ENGINE_PID_ENV = "HIL_RANK_ENGINE_PID"


def share_with_ranks(config: dict[str, Any]) -> None:
    """Leave ``config`` in this process's environment for the ranks it is about to start."""
    os.environ[RANK_CONFIG_ENV] = json.dumps(config)
    os.environ[ENGINE_PID_ENV] = str(os.getpid())


def _engine_config() -> dict[str, Any] | None:
    """The engine configuration shared with this process, where it is a rank (not the engine
    process itself, which set it)."""
    raw = os.environ.get(RANK_CONFIG_ENV)
    if not raw or os.environ.get(ENGINE_PID_ENV) == str(os.getpid()):
        return None
    return dict(json.loads(raw))


def _install_in_rank() -> None:
    config = _engine_config()
    if config is None:
        return
    import_modules(KindModules.from_config(config).probe_modules)
    faults.apply_faults(list(config.get("faults", [])), config, rank=None)


_install_in_rank()


class RankExtension:
    """Mixed into every rank's worker; its methods run in the rank's process when the engine
    process calls ``collective_rpc("hil_...")``. ``self`` is vLLM's worker (``rank``,
    ``local_rank``, ``model_runner``)."""

    def hil_rank(self) -> dict[str, Any]:
        """Who this rank is: its rank, local rank, process and the world it belongs to."""
        world = getattr(getattr(self, "parallel_config", None), "world_size", None)
        config = _engine_config()
        prefixes = tuple(KindModules.from_config(config).rank_env_prefixes) if config else ()
        return {"rank": int(getattr(self, "rank", -1)),
                "local_rank": int(getattr(self, "local_rank", -1)),
                "pid": os.getpid(),
                "world_size": None if world is None else int(world),
                # what this rank's runtime reads to pick its device (its kind's variables)
                "env": {k: v for k, v in sorted(os.environ.items())
                        if prefixes and k.startswith(prefixes)}}

    def hil_runner_facts(self) -> dict[str, Any]:
        """What this rank's model runner holds for the KV ledgers (``rank_runner_facts``)."""
        facts = rank_runner_facts(getattr(self, "model_runner", None))
        facts["rank"] = int(getattr(self, "rank", -1))
        return facts

    def hil_arm(self) -> None:
        """Install the faults that name this rank, then arm every fault installed here."""
        config = _engine_config()
        me = self.hil_rank()
        if config is not None:
            faults.apply_faults(list(config.get("faults", [])), config, rank=me["rank"],
                                only_ranked=True)
        faults.arm()
        print(f"[hil] rank {me['rank']} of {me['world_size']} ready in pid {me['pid']}",
              flush=True)


def arm_ranks(executor: Any) -> None:
    """Arm the faults of every rank of ``executor`` (a tensor-parallel engine's)."""
    executor.collective_rpc("hil_arm")


def rank_facts(executor: Any) -> list[dict[str, Any]]:
    """``hil_rank`` of every rank of ``executor``, in rank order."""
    return list(executor.collective_rpc("hil_rank"))
