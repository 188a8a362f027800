"""Faults injected into the real stack, to prove that each check can fail.

A fault is named in ``EngineConfig.faults`` (or with ``--inject-fault``) as
``NAME`` or ``NAME:key=value,key=value``; NAME is a key of ``FAULTS``, or a
``package.module.function`` path when ``--allow-external-faults`` is given. It runs inside the engine process before
vLLM builds the engine, so it can patch vLLM or a plugin at class level.
Faults print a ``[hil] fault`` line to the engine log when they fire.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

FaultFn = Callable[..., None]

# Faults stay dormant through engine start-up (warmup, profiling) until armed.
_armed = {"on": False}


def arm() -> None:
    """Let installed faults fire from now on (called once the engine has started)."""
    _armed["on"] = True


def armed() -> bool:
    return _armed["on"]


def perturb_logit(config: dict[str, Any], position: str = "5", row: str = "0") -> None:
    """Once, at the ``position``-th sampling step after the engine started, make the
    least likely token the argmax in batch row ``row``: one wrong token, far from a
    near-tie. For a request running alone, that step is its generated position."""
    import torch
    from vllm.v1.sample.sampler import Sampler

    pos, r = int(position), int(row)
    original = Sampler.forward
    state = {"fired": False, "calls": 0}

    def forward(self: Any, logits: torch.Tensor, sampling_metadata: Any, *a: Any, **kw: Any) -> Any:
        if not armed() or state["fired"] or logits.shape[0] <= r:
            return original(self, logits, sampling_metadata, *a, **kw)
        state["calls"] += 1
        if state["calls"] == pos + 1:
            logits = logits.clone()
            worst = int(torch.argmin(logits[r]))
            logits[r, worst] = logits[r].max() + 20.0
            state["fired"] = True
            print(f"[hil] fault perturb_logit fired: row {r}, position {pos}, token {worst}",
                  flush=True)
        return original(self, logits, sampling_metadata, *a, **kw)

    Sampler.forward = forward  # type: ignore[method-assign]


def forget_free(config: dict[str, Any], after: str = "0") -> None:
    """The ``after``-th time (0-based) a request's blocks go back to vLLM's BlockPool once
    the engine has started, one block is dropped: neither free nor owned any more."""
    from vllm.v1.core.block_pool import BlockPool

    original = BlockPool.free_blocks
    state = {"calls": 0, "fired": False}

    def free_blocks(self: Any, ordered_blocks: Any) -> None:
        blocks = list(ordered_blocks)
        if armed() and not state["fired"] and blocks:
            if state["calls"] == int(after):
                state["fired"] = True
                print(f"[hil] fault forget_free fired: block {blocks[-1].block_id} not freed",
                      flush=True)
                blocks = blocks[:-1]
            state["calls"] += 1
        return original(self, blocks)

    BlockPool.free_blocks = free_blocks  # type: ignore[method-assign]


def leak_warmup_block(config: dict[str, Any]) -> None:
    """vllm-spyre: a warmup request's reservation is never released, so the runner keeps
    counting blocks for a request that no longer exists after warmup."""
    smr = _spyre_runner_module()

    cls = smr.ContinuousBatchingSpyreModelRunner
    original = cls.complete_warmup

    def complete_warmup(self: Any, *a: Any, **kw: Any) -> Any:
        out = original(self, *a, **kw)
        self.req_ids2num_reserved_blocks["warmup-0"] = 1
        print("[hil] fault leak_warmup_block fired: warmup-0 keeps 1 reserved block", flush=True)
        return out

    cls.complete_warmup = complete_warmup  # type: ignore[method-assign]


def kv_blocks_short(config: dict[str, Any], by: str = "1") -> None:
    """The device provides ``by`` fewer KV blocks than configured (num_gpu_blocks_override)."""
    from vllm.engine.arg_utils import EngineArgs

    original = EngineArgs.create_engine_config

    def create_engine_config(self: Any, *a: Any, **kw: Any) -> Any:
        if self.num_gpu_blocks_override:
            self.num_gpu_blocks_override -= int(by)
            print(f"[hil] fault kv_blocks_short: override now {self.num_gpu_blocks_override}",
                  flush=True)
        return original(self, *a, **kw)

    EngineArgs.create_engine_config = create_engine_config  # type: ignore[method-assign]


def crash_engine(config: dict[str, Any], when: str = "start") -> None:
    """The engine process dies: at start (a card that cannot come up) or at its first
    generate/step call (a card that falls over under load)."""
    import os

    if when == "start":
        print("[hil] fault crash_engine: exiting at start", flush=True)
        os._exit(3)
    from vllm.v1.engine.llm_engine import LLMEngine

    def step(self: Any, *a: Any, **kw: Any) -> Any:
        if armed():
            print("[hil] fault crash_engine: exiting during a step", flush=True)
            os._exit(3)
        return original(self, *a, **kw)

    original = LLMEngine.step
    LLMEngine.step = step  # type: ignore[method-assign]


def hang_engine(config: dict[str, Any]) -> None:
    """The engine stops answering at its first step after start (a hung device)."""
    import time

    from vllm.v1.engine.llm_engine import LLMEngine

    original = LLMEngine.step

    def step(self: Any, *a: Any, **kw: Any) -> Any:
        if armed():
            print("[hil] fault hang_engine: hanging", flush=True)
            while True:
                time.sleep(60)
        return original(self, *a, **kw)

    LLMEngine.step = step  # type: ignore[method-assign]


def _spyre_runner_module() -> Any:
    """vllm-spyre's runner module, imported after vLLM has resolved its platform (an early
    import would pin vLLM 0.9 to its unspecified platform)."""
    from vllm.platforms import current_platform

    current_platform.get_device_name  # noqa: B018 - resolves the platform plugin
    from vllm_spyre.v1.worker import spyre_model_runner

    return spyre_model_runner


def keep_dummy_on_join(config: dict[str, Any]) -> None:
    """vllm-spyre 0.3-0.4: when a new request joins a lone decoding request, the dummy that
    padded the decode batch keeps its blocks instead of returning them to the pool."""
    smr = _spyre_runner_module()

    cls = smr.ContinuousBatchingSpyreModelRunner
    original = cls._update_states

    def _update_states(self: Any, scheduler_output: Any) -> Any:
        joining = armed() and bool(getattr(scheduler_output, "scheduled_new_reqs", None))
        kept = list(getattr(self, "dummy_req_ids2blocks", [])) if joining else []
        if kept:
            self.dummy_req_ids2blocks = []
        out = original(self, scheduler_output)
        if kept:
            self.dummy_req_ids2blocks = kept + list(self.dummy_req_ids2blocks)
            print(f"[hil] fault keep_dummy_on_join fired: dummy keeps blocks {kept}", flush=True)
        return out

    cls._update_states = _update_states  # type: ignore[method-assign]


def open_other_card(config: dict[str, Any], address: str) -> None:
    """The engine's runtime is pointed at another card than the leased one (its
    AIU_WORLD_RANK_0), to prove the on-card verification fails."""
    import os

    os.environ["AIU_WORLD_RANK_0"] = address
    print(f"[hil] fault open-other-card: AIU_WORLD_RANK_0={address}", flush=True)


def _patch_logits(perturb: Callable[[Any], Any]) -> None:
    """Route the logits every engine step hands to vLLM's sampler through ``perturb`` (after
    start-up), before the sampler computes the logprobs it reports: as a kernel error would."""
    from vllm.v1.sample.sampler import Sampler

    original = Sampler.forward

    def forward(self: Any, logits: Any, sampling_metadata: Any, *a: Any, **kw: Any) -> Any:
        if armed():
            logits = perturb(logits)
        return original(self, logits, sampling_metadata, *a, **kw)

    Sampler.forward = forward  # type: ignore[method-assign]


def kernel_drift(config: dict[str, Any], rel: str = "0.03") -> None:
    """A small numerics error in a kernel: the final RMSNorm's gain is off by ``rel`` (relative),
    so every logit (the LM head is linear, without bias) is scaled by ``1 + rel``. The argmax
    never changes, so greedy tokens stay equal at every position; the logprobs move."""
    eps = float(rel)
    said = {"done": False}

    def perturb(logits: Any) -> Any:
        if not said["done"]:
            said["done"] = True
            print(f"[hil] fault kernel_drift fired: logits scaled by {1 + eps:g}", flush=True)
        return logits * (1 + eps)

    _patch_logits(perturb)


def drift_after_near_tie(config: dict[str, Any], after: str = "3", tol: str = "0.05") -> None:
    """A device that wanders off a few tokens after an honest near-tie: at the first decode step
    of an engine call where a batch row's own top-2 probabilities are within ``tol``, that row
    takes the runner-up (the swap a near-tie allows); ``after`` steps later, the same row's least
    likely token becomes its argmax. Rows of a batch keep their slot while every request decodes
    (equal lengths), so the row is the same request. Re-armed at each ``LLM.generate`` call, so a
    teacher-forced run of the same requests meets the same error."""
    import torch
    from vllm import LLM

    n_after, gap_tol = int(after), float(tol)
    state: dict[str, Any] = {"row": None, "calls": 0, "rows": 0, "done": False}
    original_generate = LLM.generate

    def generate(self: Any, *a: Any, **kw: Any) -> Any:
        state.update(row=None, calls=0, rows=0, done=False)
        return original_generate(self, *a, **kw)

    LLM.generate = generate  # type: ignore[method-assign]

    def perturb(logits: torch.Tensor) -> torch.Tensor:
        state["calls"] += 1
        if state["done"]:
            return logits
        if state["row"] is None:
            if state["calls"] < 2:  # the prefill's first token: rows are not decode slots yet
                return logits
            probs = torch.softmax(logits.float(), dim=-1)
            top = torch.topk(probs, 2, dim=-1)
            gaps = top.values[:, 0] - top.values[:, 1]
            rows = torch.nonzero(gaps <= gap_tol).flatten().tolist()
            if not rows:
                return logits
            r = int(rows[0])
            logits = logits.clone()
            a_id, b_id = int(top.indices[r, 0]), int(top.indices[r, 1])
            logits[r, a_id], logits[r, b_id] = logits[r, b_id].clone(), logits[r, a_id].clone()
            state.update(row=r, rows=logits.shape[0], fired_at=state["calls"])
            print(f"[hil] fault drift_after_near_tie: near-tie swap in row {r}"
                  f" (gap {float(gaps[r]):.4f}), tokens {a_id}<->{b_id}", flush=True)
            return logits
        if state["calls"] == state["fired_at"] + n_after and logits.shape[0] == state["rows"]:
            r = state["row"]
            logits = logits.clone()
            worst = int(torch.argmin(logits[r]))
            logits[r, worst] = logits[r].max() + 20.0
            state["done"] = True
            print(f"[hil] fault drift_after_near_tie fired: row {r}, {n_after} steps after the"
                  f" near-tie, token {worst}", flush=True)
        return logits

    _patch_logits(perturb)


FAULTS: dict[str, FaultFn] = {
    "keep-dummy-on-join": keep_dummy_on_join,
    "crash-engine": crash_engine,
    "hang-engine": hang_engine,
    "perturb-logit": perturb_logit,
    "forget-free": forget_free,
    "leak-warmup-block": leak_warmup_block,
    "kv-blocks-short": kv_blocks_short,
    "open-other-card": open_other_card,
    "kernel-drift": kernel_drift,
    "drift-after-near-tie": drift_after_near_tie,
}


ALLOW_EXTERNAL_ENV = "HIL_ALLOW_EXTERNAL_FAULTS"


def parse_fault(spec: str, allow_external: bool = False) -> tuple[FaultFn, dict[str, str]]:
    """``NAME[:k=v,...]`` -> (function, keyword arguments as strings). A
    ``module.function`` NAME imports and calls code, so it needs ``allow_external``."""
    name, _, argstr = spec.partition(":")
    kwargs: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in argstr.split(","))):
        key, eq, value = part.partition("=")
        if not eq:
            raise ValueError(f"fault {spec!r}: argument {part!r} is not key=value")
        kwargs[key.strip()] = value.strip()
    if name in FAULTS:
        return FAULTS[name], kwargs
    if "." in name and allow_external:
        module, _, func = name.rpartition(".")
        return getattr(importlib.import_module(module), func), kwargs
    if "." in name:
        raise ValueError(
            f"fault {name!r} is not one of the harness's faults ({', '.join(FAULTS)}); a"
            " module.function fault imports and runs code from outside the harness: pass"
            " --allow-external-faults to allow it"
        )
    raise ValueError(f"unknown fault {name!r}; known: {', '.join(FAULTS)}"
                     " (or a module.function path with --allow-external-faults)")


def env_fault_specs(value: str) -> list[str]:
    """The fault specs of a ``HIL_FAULTS`` value (separated by ";")."""
    return [x.strip() for x in value.split(";") if x.strip()]


def check_fault_specs(value: str, allow_external: bool = False) -> None:
    """Raise ValueError for a ``HIL_FAULTS`` value naming a fault not allowed (nothing is
    imported for a known name; an external one is only checked by name here)."""
    for spec in env_fault_specs(value):
        name = spec.partition(":")[0]
        if name in FAULTS or ("." in name and allow_external):
            continue
        parse_fault(spec, allow_external=False)  # raises with the message


def apply_faults(specs: list[str], config: dict[str, Any]) -> None:
    """Install every fault in ``specs`` and in ``$HIL_FAULTS`` (separated by ";"; set per
    device in an inventory to simulate a broken card); called before vLLM starts.
    External ``module.function`` faults only with ``$HIL_ALLOW_EXTERNAL_FAULTS=1``, which
    ``--allow-external-faults`` sets."""
    import os

    allow = os.environ.get(ALLOW_EXTERNAL_ENV, "") not in ("", "0")
    env_specs = env_fault_specs(os.environ.get("HIL_FAULTS", ""))
    for spec in list(specs) + env_specs:
        fn, kwargs = parse_fault(spec, allow_external=allow)
        fn(config, **kwargs)
        print(f"[hil] fault installed: {spec}", flush=True)
