"""The engine side of EngineHost: runs inside the engine's own process.

Started as ``python -m harness.in_engine.process ADDRESS`` with the target's
environment already applied; vLLM is imported only after fault hooks ran, so
a hook can patch vLLM or a plugin before the engine is built. Commands build
typed records (``harness.core.trace``) and serialise them only when answering.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from multiprocessing.connection import Client, Connection
from typing import Any

from harness.core.cpu_share import take_share
from harness.core.ports import pick_bind_ports
from harness.core.serialise import snapshot_to_dict, trace_to_dict
from harness.core.trace import SOURCE_VLLM_SCHEDULER, KvSnapshot, RequestTrace, StepRecord, Trace
from harness.in_engine import faults, ranks
from harness.in_engine import teacher_forcing as forcing
from harness.in_engine.executed import ExecutedTokens
from harness.in_engine.kind_modules import KindModules, engine_info, import_modules
from harness.in_engine.legacy_preemptions import recorded_schedule
from harness.in_engine.probe_delta import DeltaTracker
from harness.in_engine.probes import snapshot_engine
from harness.in_engine.requests import aborted_traces, prefill_ids, prompt_progress, request_trace
from harness.in_engine.teacher_forcing import EXTRA_ARG, forced_request_trace


def _error(e: BaseException) -> tuple[str, dict[str, str]]:
    return "error", {
        "type": type(e).__name__,
        "message": str(e).strip().splitlines()[-1] if str(e).strip() else repr(e),
        "traceback": traceback.format_exc(),
    }


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


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


def _answer(trace: Trace, compute_seconds: float,
            probe: dict[str, float] | None = None) -> dict[str, Any]:
    answer: dict[str, Any] = {"trace": trace_to_dict(trace), "compute_seconds": compute_seconds}
    if probe is not None:  # time spent reading KV ledgers (step-driven runs)
        answer["probe"] = probe
    return answer


class EngineSide:
    """Owns the vllm.LLM and answers the host's commands."""

    def __init__(self, config: dict[str, Any], llm_kwargs: dict[str, Any]) -> None:
        self.config = config

        device = os.environ.get("HIL_DEVICE_ID", "cpu (shared)")
        print(f"[hil] engine {config.get('target')} {config.get('mode') or ''} on device {device}",
              flush=True)
        import_modules(KindModules.from_config(config).probe_modules)  # the kind's ledger readers
        # A tensor-parallel engine's process is none of its ranks: faults naming a rank are
        # the ranks' own (harness.in_engine.ranks).
        one_rank = int(config.get("tensor_parallel_size") or 1) == 1
        faults.apply_faults(list(config.get("faults", [])), config, rank=0 if one_rank else None)
        take_share()  # its share of the cores, before the model's threads start
        # deferred: a heavy import, paid only where this runs
        from vllm import LLM

        llm_kwargs = dict(llm_kwargs)
        self.forcing_unsupported = forcing.install(llm_kwargs)
        if not one_rank:
            ranks.share_with_ranks(config)  # their faults and readers, in their processes
        pick_bind_ports()  # as late as can be, here: its ranks inherit them (harness.core.ports)
        self.llm = LLM(**llm_kwargs)
        self.compute_seconds = 0.0
        self._time_forward_passes()
        faults.arm()
        if self._rank_executor() is not None:
            ranks.arm_ranks(self._rank_executor())

    def _time_forward_passes(self) -> None:
        """Accumulate the time the executor spends running the model (the compute floor)."""
        executor = self.llm.llm_engine.engine_core.engine_core.model_executor
        original = executor.execute_model

        def execute_model(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return original(*a, **kw)
            finally:
                self.compute_seconds += time.perf_counter() - t0

        executor.execute_model = execute_model

    def info(self) -> dict[str, Any]:
        # deferred: a heavy import, paid only where this runs
        import vllm
        from vllm.platforms import current_platform

        vcfg = self.llm.llm_engine.vllm_config
        info: dict[str, Any] = {
            "platform": type(current_platform).__name__,
            "platform_module": type(current_platform).__module__,
            "plugins": os.environ.get("VLLM_PLUGINS"),  # the plugins this engine was told to load
            "vllm_version": vllm.__version__,
            "num_gpu_blocks": vcfg.cache_config.num_gpu_blocks,
            "block_size": vcfg.cache_config.block_size,
            "max_model_len": vcfg.model_config.max_model_len,
            "max_num_seqs": vcfg.scheduler_config.max_num_seqs,
            # The batch TKV limit a plugin's scheduler admits and pauses by (Spyre's); None
            # where it has none.
            "max_batch_tkv_limit": _opt_int(getattr(self._engine_core().scheduler,
                                                    "max_batch_tkv_limit", None)),
            # What the model computes in (torch.float32, torch.bfloat16): a target that asked
            # for a precision checks it got it (a silent fp32 fallback would pass its checks).
            "model_dtype": str(vcfg.model_config.dtype),
            "pid": os.getpid(),
            # The ranks that really run the model: each answers from its own process in a
            # tensor-parallel engine the harness asked for; a one-rank engine's is this
            # process; None where ranks run that the harness did not start with its extension
            # (a lab's own engine arguments: Neuron's inventory TP), which it cannot ask.
            "world_size": int(vcfg.parallel_config.world_size),
            "ranks": self._rank_answers(int(vcfg.parallel_config.world_size)),
            # None: teacher-forced requests run here; else why not.
            "teacher_forcing_unsupported": self.forcing_unsupported,
        }
        try:
            snaps = self.snapshots()
            real = [k for k in snaps if k.source != SOURCE_VLLM_SCHEDULER] or snaps
            if real:
                info["kv_source"] = real[-1].source
                info["kv_num_blocks"] = real[-1].num_blocks
                info["kv_block_size"] = real[-1].block_size
                info["kv_pad_blocks"] = len(real[-1].pad_blocks)
                # The blocks the device's KV cache really holds, where the ledger reads it.
                info["kv_device_blocks"] = real[-1].device_blocks
        except Exception as e:  # the ledger is optional for serving; say why it is absent
            info["kv_error"] = repr(e)
        info.update(engine_info(self.config, vcfg))  # the kind's own facts, by the name it sent
        return info

    def generate(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Run all requests in one engine call; greedy, ignore_eos, top-k logprobs."""
        # deferred: a heavy import, paid only where this runs
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
        compute0 = self.compute_seconds
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        self.drain()  # leave the engine idle for the next test
        after = metric_values(self.llm)
        trace = Trace(target="", metrics=metric_delta(before, after))
        for r, out in zip(reqs, outputs, strict=True):
            trace.requests[r["request_id"]] = request_trace(r["request_id"], out, r["prompt_token_ids"])
        if payload.get("teacher") and self.forcing_unsupported is None:
            trace.forced = self._forced(reqs, payload["teacher"], k)
        return _answer(trace, self.compute_seconds - compute0)

    def _forced(self, reqs: list[dict[str, Any]], teacher: dict[str, list[int]],
                k: int) -> dict[str, RequestTrace]:
        """The teacher-forced run (``harness.in_engine.teacher_forcing``): the requests again, in one
        batch, each fed the reference's tokens ``teacher[request_id]``."""
        # deferred: a heavy import, paid only where this runs
        from vllm import SamplingParams

        todo = [r for r in reqs if teacher.get(r["request_id"])]
        params = [
            SamplingParams(temperature=0.0, max_tokens=len(teacher[r["request_id"]]),
                           ignore_eos=True, logprobs=k, detokenize=False,
                           extra_args={EXTRA_ARG: list(teacher[r["request_id"]])})
            for r in todo
        ]
        prompts = [{"prompt_token_ids": list(r["prompt_token_ids"])} for r in todo]
        outputs = self.llm.generate(prompts, params, use_tqdm=False) if todo else []
        self.drain()
        return {r["request_id"]: forced_request_trace(r["request_id"], out, r["prompt_token_ids"])
                for r, out in zip(todo, outputs, strict=True)}

    # -- step-driven runs -----------------------------------------------------
    def _engine_core(self) -> Any:
        return self.llm.llm_engine.engine_core.engine_core

    def _model_runner(self) -> Any:
        """The model runner where it is in this process (None: a tensor-parallel engine's
        runners are in its ranks' processes, read through ``harness.in_engine.ranks``)."""
        worker = getattr(self._engine_core().model_executor, "driver_worker", None)
        return None if worker is None else worker.worker.model_runner

    def _rank_answers(self, world_size: int) -> list[dict[str, Any]] | None:
        """Every rank's ``hil_rank`` (see ``info``)."""
        if self._rank_executor() is not None:
            return ranks.rank_facts(self._rank_executor())
        if world_size > 1:
            return None
        return [{"rank": 0, "local_rank": 0, "pid": os.getpid(), "world_size": 1}]

    def _rank_executor(self) -> Any:
        """The executor whose ranks run in processes of their own with the harness's rank
        extension (the engine was asked for more than one rank: ``VllmTarget.llm_kwargs``), or
        None."""
        if int(self.config.get("tensor_parallel_size") or 1) <= 1:
            return None
        return self._engine_core().model_executor

    def _capture_schedule(self) -> list[Any]:
        """Record every SchedulerOutput (for preempted and finished ids per step)."""
        sched = self._engine_core().scheduler
        if not hasattr(self, "_sched_outputs"):
            self._sched_outputs: list[Any] = []
            original = recorded_schedule(sched)  # vLLM 0.9: adds the preemption records

            def schedule(*a: Any, **kw: Any) -> Any:
                out = original(*a, **kw)
                self._sched_outputs.append(out)
                return out

            sched.schedule = schedule
        return self._sched_outputs

    def _executed_tokens(self) -> Any:
        """Count the tokens the executor runs per request (installed once)."""
        if not hasattr(self, "_executed"):
            self._executed = ExecutedTokens(self._engine_core().model_executor)
        return self._executed

    def drain(self) -> int:
        """Step until the runner has been told of every finished request (idle).

        ``LLM.generate`` returns when the last request finishes, one step before the
        runner hears of it and frees its blocks; the engine's next step delivers that.
        Returns the number of steps taken.
        """
        engine = self.llm.llm_engine
        sched = self._engine_core().scheduler
        steps = 0
        while sched.has_requests() and not engine.has_unfinished_requests():
            engine.step()
            steps += 1
            if steps > 100:
                raise RuntimeError("engine did not become idle within 100 steps after its requests finished")
        return steps

    def snapshots(self, tracker: Any = None) -> list[KvSnapshot]:
        """The KV ledgers of this engine right now (scheduler, and runner where it has one);
        with a ``DeltaTracker``, large pools may answer with deltas."""
        return snapshot_engine(self._engine_core(), tracker, self._rank_executor())

    def kv_snapshot(self, _payload: Any = None) -> list[dict[str, Any]]:
        """``snapshots()`` for the host."""
        return [snapshot_to_dict(s) for s in self.snapshots()]

    def run_steps(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Drive requests through the engine one step at a time, recording each step.

        Requests arrive at their ``arrival_step``, and one with an ``abort_step`` is
        aborted just before that step through the engine's own client call
        (``LLMEngine.abort_request``, as a server does when a client goes away) if it is
        still live then; stepping goes on until the scheduler has nothing left,
        including finished ids not yet delivered to the runner, so the last step is the
        one where the runner frees them.
        """
        # deferred: a heavy import, paid only where this runs
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        probe = bool(payload.get("probe", True))
        max_steps = int(payload.get("max_steps", 2000))
        k = int(payload["logprobs"])
        engine = self.llm.llm_engine
        core = self._engine_core()
        sched = core.scheduler
        sched_outputs = self._capture_schedule()
        executed = self._executed_tokens()
        runner = self._model_runner()

        def scenario_id(engine_id: str) -> str:  # engine ids carry a suffix
            return internal.get(engine_id, engine_id)

        def scenario_ids(ids: Any) -> list[str]:
            return [scenario_id(str(i)) for i in ids or ()]

        tracker = DeltaTracker()
        # Reads where some pool was read in full, and reads that were deltas only.
        probe_cost = {"full_reads": 0, "full_seconds": 0.0, "delta_reads": 0, "delta_seconds": 0.0}

        def kv(last: bool = False) -> list[KvSnapshot]:
            if not probe:
                return []
            t0 = time.perf_counter()
            tracker.force_full = last  # the idle point gets a full snapshot
            snaps = self.snapshots(tracker)
            for snap in snaps:
                snap.owned = {scenario_id(k): v for k, v in snap.owned.items()}
                if snap.reserved is not None:
                    snap.reserved = {scenario_id(k): v for k, v in snap.reserved.items()}
                if snap.serving is not None:
                    snap.serving = [scenario_id(k) for k in snap.serving]
                if snap.promised is not None:
                    snap.promised = {scenario_id(k): v for k, v in snap.promised.items()}
                if snap.runner_blocks is not None:
                    snap.runner_blocks = {scenario_id(k): v for k, v in snap.runner_blocks.items()}
                if snap.predicted_batch is not None:
                    snap.predicted_batch = [scenario_id(k) for k in snap.predicted_batch]
                if snap.runner_cached is not None:
                    snap.runner_cached = {scenario_id(k): v for k, v in snap.runner_cached.items()}
                for facts in snap.ranks or ():
                    facts["table"] = (None if facts.get("table") is None else
                                      {scenario_id(k): v for k, v in facts["table"].items()})
                    for key in ("runner_blocks", "runner_cached"):
                        held = (facts.get("fields") or {}).get(key)
                        if held is not None:
                            facts["fields"][key] = {scenario_id(k): v for k, v in held.items()}
                snap.dummy_ids = [scenario_id(k) for k in snap.dummy_ids]
            kind = "delta" if all(k.is_delta() for k in snaps) else "full"
            probe_cost[f"{kind}_reads"] += 1
            probe_cost[f"{kind}_seconds"] += time.perf_counter() - t0
            return snaps

        pending = sorted(payload["requests"], key=lambda r: int(r.get("arrival_step", 0)))
        max_tokens = {str(r["request_id"]): int(r["max_tokens"]) for r in payload["requests"]}
        aborts = {str(r["request_id"]): int(r["abort_step"]) for r in payload["requests"]
                  if r.get("abort_step") is not None}
        internal: dict[str, str] = {}  # engine request id -> scenario request id
        preemptions: dict[str, int] = {}
        finals: dict[str, Any] = {}
        gone: dict[str, RequestTrace] = {}  # the aborted requests, as they left
        self.drain()  # the initial snapshot must be an idle point
        before = metric_values(self.llm)
        compute0 = self.compute_seconds
        # an idle point: nothing arrived, nothing prefilled, no prefill under way
        initial = StepRecord(step=-1, tkv=getattr(runner, "tkv", None), kv=kv(),
                             arrived=[], prefilled=[], prefilling=[])
        executed.take()  # what the drain ran belongs to no step of this run
        steps: list[StepRecord] = []
        step = 0
        while pending or sched.has_requests():
            arrived: list[str] = []
            while pending and int(pending[0].get("arrival_step", 0)) <= step:
                r = pending.pop(0)
                arrived.append(str(r["request_id"]))
                params = SamplingParams(
                    temperature=0.0,
                    max_tokens=int(r["max_tokens"]),
                    ignore_eos=True,
                    logprobs=k,
                    detokenize=False,
                    output_kind=RequestOutputKind.FINAL_ONLY,
                )
                rid = engine.add_request(
                    r["request_id"], {"prompt_token_ids": list(r["prompt_token_ids"])}, params
                )
                internal[str(rid or r["request_id"])] = r["request_id"]
            live = {scenario_id(str(rid)) for rid in sched.requests}
            aborted = sorted(rid for rid, at in aborts.items() if at == step and rid in live)
            if aborted:  # what they computed first: the abort drops it from the engine
                states = getattr(getattr(engine, "output_processor", None), "request_states", None)
                gone.update(aborted_traces(sched, states, set(aborted), scenario_id, step))
                engine.abort_request(aborted)  # the client's ids; the engine maps its own
            n_sched = len(sched_outputs)
            progress = prompt_progress(sched)  # what admission sees: prefills under way
            outs = engine.step() if sched.has_requests() else []
            so = sched_outputs[-1] if len(sched_outputs) > n_sched else None
            for rid, req in sched.requests.items():
                preemptions[scenario_id(rid)] = int(getattr(req, "num_preemptions", 0))
            finished_now = []
            for o in outs:
                if o.finished:
                    finals[o.request_id] = o
                    finished_now.append(scenario_id(o.request_id))
            steps.append(
                StepRecord(
                    step=step,
                    scheduled=so is not None,
                    running=scenario_ids(r.request_id for r in sched.running),
                    waiting=scenario_ids(r.request_id for r in sched.waiting),
                    finished=finished_now,
                    aborted=aborted,
                    preempted=sorted(scenario_ids(getattr(so, "preempted_req_ids", None))),
                    delivered_finished=sorted(scenario_ids(getattr(so, "finished_req_ids", None))),
                    preemptions={scenario_id(rid): int(getattr(req, "num_preemptions", 0))
                                 for rid, req in sched.requests.items()},
                    paused=sorted(scenario_ids(
                        r.request_id for r in getattr(sched, "paused_decoding_requests", ()))),
                    num_scheduled_tokens=int(getattr(so, "total_num_scheduled_tokens", 0) or 0),
                    tkv=getattr(runner, "tkv", None),
                    kv=kv(last=not (pending or sched.has_requests())),
                    executed={scenario_id(r): n for r, n in executed.take().items()},
                    arrived=arrived,
                    prefilled=None if progress is None else scenario_ids(
                        prefill_ids(progress, getattr(so, "num_scheduled_tokens", None))),
                    prefilling=None if progress is None else sorted(scenario_ids(
                        r.request_id for r in sched.running
                        if int(r.num_computed_tokens) < int(r.num_prompt_tokens))),
                )
            )
            step += 1
            if step > max_steps:
                raise RuntimeError(
                    f"scenario did not finish within {max_steps} engine steps; still running"
                    f" {[r.request_id for r in sched.running]}, waiting"
                    f" {[r.request_id for r in sched.waiting]}"
                )
        after = metric_values(self.llm)
        trace = Trace(target="", steps=steps, initial=initial,
                      idle_at_end=not sched.has_requests(), metrics=metric_delta(before, after),
                      aborted=gone)
        for rid, out in finals.items():
            sid = scenario_id(rid)
            trace.requests[sid] = request_trace(sid, out, [], preemptions.get(sid, 0),
                                                max_tokens.get(sid))
        return _answer(trace, self.compute_seconds - compute0, probe_cost if probe else None)

    def metrics(self, _payload: Any = None) -> dict[str, float]:
        return metric_values(self.llm)


def serve(conn: Connection) -> int:
    op, payload = conn.recv()
    if op != "start":
        conn.send(("error", {"type": "ProtocolError", "message": f"expected start, got {op}"}))
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
            conn.send(("error", {"type": "ProtocolError", "message": f"unknown command {op!r}"}))
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
