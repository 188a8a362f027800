"""Hand-built sendnn-inference 2.x traces for the promise and admission checks: a pool of
``N`` blocks of ``BS`` tokens with the pad block 0, promises on vLLM's scheduler snapshot."""

from __future__ import annotations

from harness.core.trace import KvSnapshot, RequestTrace, StepRecord, Trace

SRC = "vllm-scheduler"
BS = 64
N = 10  # blocks 1..9 usable


def snap(owned: dict[str, list[int]] | None = None, promised: dict[str, int] | None = None,
         n: int = N, serving: list[str] | None = None, free: list[int] | None = None,
         total: int | None = None) -> KvSnapshot:
    """A 2.x scheduler snapshot: every block not owned is free, the promises' total is theirs,
    the scheduler serves every request it promises or that owns blocks."""
    owned = owned or {}
    promised = {} if promised is None else promised
    used = {b for ids in owned.values() for b in ids}
    free = [b for b in range(1, n) if b not in used] if free is None else free
    serving = sorted({*owned, *promised}) if serving is None else serving
    return KvSnapshot(source=SRC, num_blocks=n, pad_blocks=[0], free_blocks=free, owned=owned,
                      counted_free=len(free), promised=promised,
                      promised_total=sum(promised.values()) if total is None else total,
                      serving=serving, ref_counts={b: 1 for b in used}, block_size=BS)


def request(req_id: str, prompt: int, max_tokens: int | None) -> RequestTrace:
    return RequestTrace(request_id=req_id, prompt_token_ids=[1] * prompt, max_tokens=max_tokens)


def step(n: int, kv: KvSnapshot, running: list[str] = (), waiting: list[str] = (),
         arrived: list[str] | None = None, prefilled: list[str] | None = None,
         prefilling: list[str] | None = None, **kw) -> StepRecord:
    """An engine step with the admission fields recorded (empty unless given)."""
    return StepRecord(step=n, running=list(running), waiting=list(waiting), kv=[kv],
                      arrived=[] if arrived is None else arrived,
                      prefilled=[] if prefilled is None else prefilled,
                      prefilling=[] if prefilling is None else prefilling, **kw)


def trace(steps: list[StepRecord], requests: list[RequestTrace], initial: KvSnapshot | None = None,
          **info) -> Trace:
    """The trace of ``steps`` after an idle start (``initial``, default an empty pool)."""
    first = StepRecord(step=-1, kv=[initial or snap()], arrived=[], prefilled=[], prefilling=[])
    return Trace(target="spyre-eager-cp", steps=steps, initial=first,
                 requests={r.request_id: r for r in requests},
                 info={"max_num_seqs": 4, "max_model_len": 256, **info})
