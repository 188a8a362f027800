"""End to end: the geometries beyond the default, once, on the default stack (one model).

``--geometry card,tight,tkv-bound,tp2`` runs only the tests that take a geometry, each in each
geometry: on sendnn-inference 2.6.3's CPU path (spyre-eager-cp) and vLLM's CPU engine every one
passes (card: the device's own block count; tkv-bound: the plugin pauses or holds back, never
recomputes; tight on vLLM: admitted, preempted and recomputed with equal tokens), except where the
geometry does not apply, each a skip quoting why: vLLM's CPU engine has no batch TKV limit (its
kind says so), and sendnn-inference 2.6.3 refuses at engine start a pool smaller than a full batch
(the plugin's own message). tp2 runs both with two tensor-parallel ranks, each answering from
a process of its own (tests/e2e/test_tensor_parallel.py proves a fault in one rank fails it).
Every result records its geometry, and the test ids name it.
"""

from __future__ import annotations

import pytest

from tests.e2e.test_tensor_parallel import engine_logs
from tests.suite_runner import run_suite

pytestmark = pytest.mark.e2e  # a child pytest starting an engine per geometry and variant

GEOMETRIES = ("card", "tight", "tkv-bound", "tp2")


def test_every_geometry_runs_the_mission_and_says_where_it_does_not_apply(tmp_path):
    run = run_suite(tmp_path, "suites", "-m", "cpu", "--model", "tiny-llama",
                    "--target", "vllm-cpu,spyre-eager-cp", "--geometry", ",".join(GEOMETRIES))

    assert run.returncode == 0, run.output[-4000:]
    # Only the tests that take a geometry: the others keep the small shapes.
    assert run.outcomes and all("in_geometry" in name for name in run.outcomes), run.outcomes
    for g in GEOMETRIES:
        for variant in ("vllm-cpu", "spyre-eager-cp"):
            name = run.named(f"[tiny-llama-{variant}-{g}]")
            assert run.properties[name].get("geometry") == g
            if (variant, g) == ("vllm-cpu", "tkv-bound"):
                assert run.outcomes[name] == "skipped"
                assert "vllm-cpu has no batch TKV limit" in run.messages[name]
            elif (variant, g) == ("spyre-eager-cp", "tight"):
                assert run.outcomes[name] == "skipped"
                assert "refuses geometry tight" in run.messages[name]
                assert "is not enough to serve the current model" in run.messages[name]
            else:
                assert run.outcomes[name] == "passed", (name, run.messages.get(name))
    for variant in ("vllm-cpu", "spyre-eager-cp"):  # both ranks of each tp2 engine answered
        (text,) = [t for name, t in engine_logs(tmp_path).items()
                   if name.startswith(variant) and "ready in pid" in t]
        assert "[hil] rank 0 of 2 ready in pid" in text and "[hil] rank 1 of 2 ready" in text
