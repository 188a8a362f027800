"""The engine side of EngineHost: runs inside the engine's own process.

Started as ``python -m harness.engine_process ADDRESS`` with the target's
environment already applied; vLLM is imported only after fault hooks ran, so
a hook can patch vLLM or a plugin before the engine is built.
"""

from __future__ import annotations

import os
import sys
import traceback
from multiprocessing.connection import Client, Connection
from typing import Any


def _error(e: BaseException) -> tuple[str, dict[str, str]]:
    return "error", {
        "type": type(e).__name__,
        "message": str(e).strip().splitlines()[-1] if str(e).strip() else repr(e),
        "traceback": traceback.format_exc(),
    }


def metric_values(llm: Any) -> dict[str, float]:
    """Counters and gauges from the engine's Prometheus metrics, by name."""
    values: dict[str, float] = {}
    for m in llm.get_metrics():
        value = getattr(m, "value", None)
        if isinstance(value, (int, float)):
            values[m.name] = values.get(m.name, 0.0) + float(value)
    return values


def metric_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


class EngineSide:
    """Owns the vllm.LLM and answers the host's commands."""

    def __init__(self, config: dict[str, Any], llm_kwargs: dict[str, Any]) -> None:
        self.config = config
        from harness import faults

        faults.apply_faults(list(config.get("faults", [])), config)
        from vllm import LLM

        self.llm = LLM(**llm_kwargs)
        faults.arm()

    def info(self) -> dict[str, Any]:
        import vllm
        from vllm.platforms import current_platform

        vcfg = self.llm.llm_engine.vllm_config
        info: dict[str, Any] = {
            "platform": type(current_platform).__name__,
            "vllm_version": vllm.__version__,
            "num_gpu_blocks": vcfg.cache_config.num_gpu_blocks,
            "block_size": vcfg.cache_config.block_size,
            "max_model_len": vcfg.model_config.max_model_len,
            "max_num_seqs": vcfg.scheduler_config.max_num_seqs,
            "pid": os.getpid(),
        }
        try:
            import vllm_spyre

            info["vllm_spyre_version"] = getattr(vllm_spyre, "__version__", "?")
        except ImportError:
            pass
        return info

    def generate(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Run all requests in one engine call; greedy, ignore_eos, top-k logprobs."""
        from vllm import SamplingParams

        reqs = payload["requests"]
        k = int(payload["logprobs"])
        prompts = [{"prompt_token_ids": list(r["prompt_token_ids"])} for r in reqs]
        params = [
            SamplingParams(
                temperature=0.0,
                max_tokens=int(r["max_tokens"]),
                ignore_eos=True,
                logprobs=k,
                detokenize=False,
            )
            for r in reqs
        ]
        before = metric_values(self.llm)
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        after = metric_values(self.llm)
        results = []
        for r, out in zip(reqs, outputs, strict=True):
            comp = out.outputs[0]
            steps = []
            for pos, tid in enumerate(comp.token_ids):
                lp_map = comp.logprobs[pos] if comp.logprobs else {}
                top = {int(t): float(lp.logprob) for t, lp in lp_map.items()}
                steps.append(
                    {
                        "token_id": int(tid),
                        "logprob": top.get(int(tid), float("nan")),
                        "top_logprobs": top,
                    }
                )
            results.append(
                {
                    "request_id": r["request_id"],
                    "prompt_token_ids": list(
                        out.prompt_token_ids or r["prompt_token_ids"]
                    ),
                    "steps": steps,
                    "num_preemptions": 0,
                    "finish_reason": comp.finish_reason,
                }
            )
        return {"requests": results, "metrics": metric_delta(before, after)}

    def metrics(self, _payload: Any = None) -> dict[str, float]:
        return metric_values(self.llm)


def serve(conn: Connection) -> int:
    op, payload = conn.recv()
    if op != "start":
        conn.send(
            ("error", {"type": "ProtocolError", "message": f"expected start, got {op}"})
        )
        return 2
    try:
        side = EngineSide(payload["config"], payload["llm_kwargs"])
        conn.send(("ok", side.info()))
    except BaseException as e:  # the host reports it with the log tail
        traceback.print_exc()
        conn.send(_error(e))
        return 1
    while True:
        try:
            op, payload = conn.recv()
        except EOFError:
            return 0
        if op == "shutdown":
            return 0
        handler = getattr(side, op, None)
        if handler is None or op.startswith("_"):
            conn.send(
                (
                    "error",
                    {"type": "ProtocolError", "message": f"unknown command {op!r}"},
                )
            )
            continue
        try:
            conn.send(("ok", handler(payload)))
        except Exception as e:
            traceback.print_exc()
            conn.send(_error(e))


def main(argv: list[str]) -> int:
    authkey = bytes.fromhex(os.environ.pop("HIL_ENGINE_AUTHKEY"))
    conn = Client(argv[1], family="AF_UNIX", authkey=authkey)
    try:
        return serve(conn)
    finally:
        conn.close()


if __name__ == "__main__":
    code = main(sys.argv)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: engine threads can hang it.
    os._exit(code)
