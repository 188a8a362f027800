"""Tensor-parallel ranks: which faults a rank installs, what a rank reports, the start check,
the ranks' agreement over a broken trace, and the geometry's way to an engine."""

import os
import pickle

import pytest

from harness.checks.ledger import check_ledger, check_step
from harness.checks.ranks import RANKS_AGREE, check_ranks_agree
from harness.core.config import ConfigError, EngineConfig
from harness.core.serialise import snapshot_from_dict, snapshot_to_dict
from harness.core.trace import KvSnapshot, StepRecord, Trace
from harness.engine.pool import ranks_problem
from harness.geometry.catalog import load_geometries, parse_geometry
from harness.in_engine import faults as faults_pkg
from harness.in_engine.fault_registry import FAULTS
from harness.in_engine.probes import rank_runner_facts, request_block_table
from harness.targets import kind
from harness.targets.base import TargetVariant
from harness.targets.declarations import RANK_EXTENSION, cpu_rank_binding


def _facts(rank, table, device=8):
    return {"rank": rank, "fields": {"device_blocks": device}, "table": table}


def _snap(ranks):
    return KvSnapshot(source="vllm-scheduler", num_blocks=8, pad_blocks=[0],
                      free_blocks=[2, 3, 4, 5, 6, 7], owned={"r0": [1]}, ranks=ranks)


# -- the ranks' agreement ---------------------------------------------------------------

def test_ranks_holding_the_same_state_agree_and_a_one_rank_snapshot_holds():
    assert check_ranks_agree(_snap(None)) == []
    assert check_ranks_agree(_snap([_facts(0, {"r0": [1]}), _facts(1, {"r0": [1]})])) == []


def test_a_rank_whose_table_differs_breaks_the_agreement_naming_the_request():
    broken = _snap([_facts(0, {"r0": [1, 2]}), _facts(1, {"r0": [7, 2]})])
    (v,) = check_ranks_agree(broken)
    assert v.invariant == RANKS_AGREE
    assert v.message == ("rank 1's request block table differs from rank 0's: request 'r0':"
                         " [7, 2] against rank 0's [1, 2]")
    missing = _snap([_facts(0, {"r0": [1]}), _facts(1, {})])
    assert "request 'r0': absent against rank 0's [1]" in check_ranks_agree(missing)[0].message


def test_a_rank_with_a_smaller_kv_cache_or_missing_ranks_breaks_the_agreement():
    (v,) = check_ranks_agree(_snap([_facts(0, {}), _facts(1, {}, device=7)]))
    assert "rank 1's KV cache block count differs from rank 0's: 7 against rank 0's 8" in v.message
    (v,) = check_ranks_agree(_snap([_facts(0, {}), _facts(2, {})]))
    assert "answered as [0, 2], not 0..1 each once" in v.message


def test_the_ledger_check_fails_on_a_rank_that_differs_at_its_step():
    good = _snap([_facts(0, {"r0": [1]}), _facts(1, {"r0": [1]})])
    bad = _snap([_facts(0, {"r0": [1]}), _facts(1, {"r0": [5]})])
    assert check_step(good, 0) == []
    trace = Trace(target="vllm-cpu", steps=[
        StepRecord(step=0, running=["r0"], kv=[good]),
        StepRecord(step=1, running=["r0"], kv=[bad]),
    ])
    verdict = check_ledger(trace)
    assert not verdict.ok
    assert verdict.check == f"kv_ledger.{RANKS_AGREE}"
    assert "broken at step 1: rank 1's request block table differs" in verdict.why


def test_rank_facts_survive_the_trip_from_the_engine():
    snap = _snap([_facts(0, {"r0": [1]}), _facts(1, {"r0": [1]})])
    assert snapshot_from_dict(snapshot_to_dict(snap)).ranks == snap.ranks
    assert snapshot_from_dict(snapshot_to_dict(_snap(None))).ranks is None


# -- what a rank reports -----------------------------------------------------------------

class _State:
    def __init__(self, ids):
        self.block_ids = ids


class _Runner:  # a plain runner: no plugin's reader claims it, so vLLM's facts are read
    def __init__(self):
        self.requests = {"a": _State(([1, 2],)), "b": _State([3])}


def test_a_rank_reports_its_request_table_and_its_kinds_fields():
    runner = _Runner()
    assert request_block_table(runner) == {"a": [1, 2], "b": [3]}
    assert request_block_table(object()) is None
    facts = rank_runner_facts(runner)
    assert facts["table"] == {"a": [1, 2], "b": [3]}
    assert facts["fields"] == {"device_blocks": None}  # not vLLM's: no cache it can size


# -- faults by rank -------------------------------------------------------------------------

@pytest.fixture
def recorded(monkeypatch):
    seen = []
    monkeypatch.setitem(FAULTS, "probe-fault", lambda config, **kw: seen.append(kw))
    monkeypatch.delenv("HIL_FAULTS", raising=False)
    return seen


def test_a_fault_naming_a_rank_is_installed_in_that_rank_alone(recorded, capsys):
    specs = ["probe-fault:rank=1,x=1", "probe-fault:x=2"]
    faults_pkg.apply_faults(specs, {}, rank=None)  # the engine process, before the ranks start
    assert recorded == [{"x": "2"}]
    assert "to be installed in rank 1 once it starts" in capsys.readouterr().out
    recorded.clear()
    faults_pkg.apply_faults(specs, {}, rank=0, only_ranked=True)  # rank 0, after start
    assert recorded == []
    assert "not installed in rank 0 (for rank 1)" in capsys.readouterr().out
    faults_pkg.apply_faults(specs, {}, rank=1, only_ranked=True)  # rank 1, after start
    assert recorded == [{"x": "1"}]
    recorded.clear()
    faults_pkg.apply_faults(specs, {})  # a one-rank engine's process is rank 0
    assert recorded == [{"x": "2"}]


def test_a_rank_that_is_no_rank_is_refused_before_any_engine_starts():
    with pytest.raises(ValueError, match="rank='one' is no rank"):
        faults_pkg.check_fault_spec("attn-scale:rank=one", ["vllm-cpu"], ["default"])
    faults_pkg.check_fault_spec("scale-partial-sum:rank=1", ["vllm-cpu"], ["default"])


def test_scale_partial_sum_scales_only_once_armed(monkeypatch):
    import sys
    import types

    import harness.in_engine.fault_registry as registry
    from harness.in_engine.faults import kernels

    class GroupCoordinator:
        world_size = 2

        def all_reduce(self, input_):
            return input_

    module = types.ModuleType("fake_parallel_state")
    module.GroupCoordinator = GroupCoordinator
    monkeypatch.setitem(sys.modules, "fake_parallel_state", module)
    monkeypatch.setattr(kernels, "_VLLM_GROUP", ("fake_parallel_state", "GroupCoordinator"))
    monkeypatch.setattr(kernels, "_FMS_TP", "no_such_fms_module")
    monkeypatch.setitem(registry._armed, "on", False)
    kernels.scale_partial_sum({}, factor="2")
    assert GroupCoordinator().all_reduce(3.0) == 3.0  # dormant through start-up
    registry.arm()
    assert GroupCoordinator().all_reduce(3.0) == 6.0


# -- the engine's start --------------------------------------------------------------------

def _cfg(tp):
    return EngineConfig(target="vllm-cpu", model="m", max_model_len=256, max_num_seqs=4,
                        tensor_parallel_size=tp)


def _info(world, ranks, pid=10):
    return {"world_size": world, "pid": pid,
            "ranks": [{"rank": r, "pid": p} for r, p in ranks]}


def test_an_engine_running_fewer_ranks_or_ranks_in_one_process_is_refused():
    assert ranks_problem(_cfg(2), _info(2, [(0, 11), (1, 12)])) is None
    assert ranks_problem(_cfg(1), _info(1, [(0, 10)])) is None
    assert ranks_problem(_cfg(2), {"pid": 10}) is None  # an engine side that reports none
    # Ranks a lab's own engine arguments started (Neuron's inventory TP): not asked, not judged.
    assert ranks_problem(_cfg(1), {"pid": 10, "world_size": 2, "ranks": None}) is None
    assert ("asked for tensor_parallel_size 2, but the engine runs world size 1 with ranks [0]"
            in ranks_problem(_cfg(2), _info(1, [(0, 10)])))
    assert "answered from processes [11, 11]" in ranks_problem(_cfg(2), _info(2, [(0, 11), (1, 11)]))
    assert "the engine process is 10" in ranks_problem(_cfg(2), _info(2, [(0, 10), (1, 12)]))


def test_one_rank_keeps_the_engine_key_and_arguments_and_ranks_ask_for_the_extension():
    one = _cfg(1)
    assert "tensor_parallel_size" not in one.to_dict()
    assert one.key != _cfg(2).key
    kw = kind("vllm-cpu")(one).llm_kwargs()
    assert "tensor_parallel_size" not in kw and "worker_extension_cls" not in kw
    kw = kind("vllm-cpu")(_cfg(2)).llm_kwargs()
    assert kw["tensor_parallel_size"] == 2 and kw["distributed_executor_backend"] == "mp"
    module, _, name = RANK_EXTENSION.rpartition(".")
    import importlib
    assert hasattr(importlib.import_module(module), name)
    with pytest.raises(ConfigError, match="tensor_parallel_size"):
        _cfg(0)


def test_cpu_ranks_bind_cores_of_their_own(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    assert cpu_rank_binding(2) == "0,1|2,3"
    assert cpu_rank_binding(4) == "0|1|2|3"
    assert cpu_rank_binding(5) is None


# -- the geometry -----------------------------------------------------------------------------

def test_the_tp2_geometry_reaches_the_engine_or_says_why_not(monkeypatch):
    g = load_geometries()["tp2"]
    assert g.tensor_parallel_size == 2 and "TP 2" in g.describe()
    cpu_kind = kind("vllm-cpu")
    assert cpu_kind.geometry_overrides(g, "default")["tensor_parallel_size"] == 2
    variant = TargetVariant("vllm-cpu", "vllm-cpu", None, None, ("cpu",))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert cpu_kind.geometry_problem(variant, g, "default") is None
    assert "not on spyre-1.10" in cpu_kind.geometry_problem(variant, g, "spyre-1.10")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert ("TP 2 needs 2 CPU cores, one per rank; this process may use 1"
            in cpu_kind.geometry_problem(variant, g, "default"))
    card = TargetVariant("spyre-sendnn-cp", "spyre", "sendnn", "cp", ("spyre", "cp"))
    # A card engine of several ranks leases a group of cards (harness.lab.leases): no core
    # per rank asked, on sendnn-inference 2.x, in a shape a card compiles (tp4's, not tp2's
    # context 256); the older generation says it does not.
    assert "does not compile geometry 'tp2'" in kind("spyre").geometry_problem(card, g, "default")
    tp4 = load_geometries()["tp4"]
    assert kind("spyre").geometry_problem(card, tp4, "default") is None
    assert ("a TP 4 engine on a card group runs on sendnn-inference 2.x"
            in kind("spyre").geometry_problem(card, tp4, "spyre-1.10"))
    four = parse_geometry("tp4", {"description": "d", "max_model_len": 256, "max_num_seqs": 4,
                                  "chunk_size": 128, "tensor_parallel_size": 4}, "lab")
    neuron = kind("neuron")
    nv = neuron.variants[0]
    assert "runs one rank per engine" in neuron.geometry_problem(nv, four, "default")


def test_the_teacher_forcing_processor_pickles_by_reference_into_a_rank():
    pytest.importorskip("vllm.v1.sample.logits_processor")
    from harness.in_engine import teacher_forcing

    cls = teacher_forcing.processor_class()
    assert pickle.loads(pickle.dumps(cls)) is cls
