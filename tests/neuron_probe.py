"""Child side of tests/unit/targets/neuron/test_config.py: vllm-neuron's real code on the harness's engine
arguments, in the ``neuron-config`` stack (vllm-neuron 0.2.0 + vLLM 0.11.0, no Neuron SDK)::

    <neuron-config python> tests/neuron_probe.py IN.json OUT.json

PYTHONPATH holds tests/neuron_sdk_stubs (the only stand-in: NxD Inference, see its README) and
the repository root. Each case builds a real ``vllm.LLM`` in this process with the harness's
keyword arguments: vLLM resolves vllm-neuron's platform through its ``neuron`` entry point,
vllm-neuron's NeuronWorker, model runner, model loader and scheduler run as they are; the
compiled model is the stub's. Then the case's requests are driven one engine step at a time,
and what vllm-neuron decided (block count and size, neuron config, sampling, batch per step,
free blocks and batch lines) is written to OUT.json for the parent to assert on.
"""

from __future__ import annotations

import glob
import json
import os
import random
import sys
import traceback
from typing import Any

FAKE_NODES = ["/dev/neuron0"]


def fake_neuron_device() -> None:
    """The one fake of the device tree: vllm_neuron.register() globs /dev/neuron*."""
    real = glob.glob

    def fake(pattern: str, *a: Any, **kw: Any) -> list[str]:
        return list(FAKE_NODES) if pattern == "/dev/neuron*" else real(pattern, *a, **kw)

    glob.glob = fake  # type: ignore[assignment]


def registration() -> dict[str, Any]:
    """What vllm-neuron's register() returns without and with a Neuron device node."""
    import vllm_neuron

    without = vllm_neuron.register()
    fake_neuron_device()
    return {"without_device": without, "with_device": vllm_neuron.register()}


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    from vllm import LLM, SamplingParams
    from vllm.platforms import current_platform
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.request import RequestStatus

    os.environ.update(case.get("env", {}))
    llm = LLM(**case["llm_kwargs"])
    engine = llm.llm_engine
    core = engine.engine_core.engine_core
    sched = core.scheduler
    vcfg = engine.vllm_config
    runner = core.model_executor.driver_worker.worker.model_runner
    pool = sched.kv_cache_manager.block_pool
    nc = runner.model.neuron_config
    out: dict[str, Any] = {
        "platform": f"{type(current_platform).__module__}.{type(current_platform).__name__}",
        "worker": f"{type(core.model_executor.driver_worker.worker).__module__}."
                  f"{type(core.model_executor.driver_worker.worker).__name__}",
        "scheduler": f"{type(sched).__module__}.{type(sched).__name__}",
        "block_size": vcfg.cache_config.block_size,
        "num_gpu_blocks_override": vcfg.cache_config.num_gpu_blocks_override,
        "num_gpu_blocks": vcfg.cache_config.num_gpu_blocks,
        "pool_blocks": pool.num_gpu_blocks,
        "pool_free_at_start": pool.get_num_free_blocks(),
        "max_num_seqs": vcfg.scheduler_config.max_num_seqs,
        "max_model_len": vcfg.model_config.max_model_len,
        "chunked_prefill": vcfg.scheduler_config.chunked_prefill_enabled,
        "prefix_caching": bool(vcfg.cache_config.enable_prefix_caching),
        "tensor_parallel_size": vcfg.parallel_config.tensor_parallel_size,
        "neuron_config": {k: getattr(nc, k, None) for k in (
            "tp_degree", "batch_size", "seq_len", "max_context_length", "pa_num_blocks",
            "pa_block_size", "is_block_kv_layout", "is_continuous_batching", "torch_dtype",
            "enable_bucketing")},
        "on_device_sampling": None if nc.on_device_sampling_config is None
        else repr(nc.on_device_sampling_config),
        "compiled": __import__("neuronx_distributed_inference.utils.constants",
                               fromlist=["StubNeuronModel"]).StubNeuronModel.compiled[-1:],
        "batch_lines": runner.max_num_reqs,
    }
    # The platform hook runs again for every VllmConfig; the null block must be added once.
    current_platform.check_and_update_config(vcfg)
    out["override_after_second_hook"] = vcfg.cache_config.num_gpu_blocks_override

    rng = random.Random(0)
    pending = sorted(case.get("requests", []), key=lambda r: r[2])
    steps: list[dict[str, Any]] = []
    finals: dict[str, Any] = {}
    step = 0
    n = 0
    while pending or sched.has_requests():
        while pending and pending[0][2] <= step:
            prompt_len, max_tokens, _ = pending.pop(0)
            rid = f"r{n}"
            n += 1
            params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                                    logprobs=case.get("logprobs", 5), detokenize=False,
                                    output_kind=RequestOutputKind.FINAL_ONLY)
            prompt = [rng.randrange(10, 2000) for _ in range(prompt_len)]
            engine.add_request(rid, {"prompt_token_ids": prompt}, params)
        outs = engine.step() if sched.has_requests() else []
        for o in outs:
            if o.finished:
                finals[o.request_id] = o
        steps.append({
            "step": step,
            "running": [r.request_id for r in sched.running],
            "waiting": [r.request_id for r in sched.waiting],
            "preempted": [r.request_id for r in sched.waiting if r.status == RequestStatus.PREEMPTED],
            "finished": [o.request_id for o in outs if o.finished],
            "free_blocks": pool.get_num_free_blocks(),
            "free_batch_lines": len(runner.free_seq_ids),
        })
        step += 1
        if step > 5000:
            raise RuntimeError("the scenario did not finish within 5000 steps")
    out["steps"] = steps
    out["requests"] = {
        rid: {"tokens": len(o.outputs[0].token_ids),
              "logprobs": None if not o.outputs[0].logprobs else len(o.outputs[0].logprobs)}
        for rid, o in finals.items()
    }
    out["free_blocks_at_end"] = pool.get_num_free_blocks()
    out["free_batch_lines_at_end"] = len(runner.free_seq_ids)
    return out


def main(argv: list[str]) -> int:
    with open(argv[1]) as f:
        job = json.load(f)
    result: dict[str, Any] = {"registration": registration()}
    try:
        result["case"] = run_case(job)
    except Exception as e:  # the parent reports it with the traceback
        result["error"] = f"{type(e).__name__}: {e}"
        result["traceback"] = traceback.format_exc()
    with open(argv[2], "w") as f:
        json.dump(result, f, default=repr)
    return 0


if __name__ == "__main__":
    code = main(sys.argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # engine threads can hang interpreter teardown
