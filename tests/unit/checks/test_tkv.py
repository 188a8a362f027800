"""The batch TKV limit, exactly (harness/checks/tkv.py): hand-built 2.x step traces, healthy
and broken one invariant at a time."""

from __future__ import annotations

from harness.checks.ledger import check_ledger
from harness.checks.tkv import (
    batch_tkv,
    check_tkv_recorded,
    folded,
    step_ranges,
    tkv_violations,
)
from harness.core.trace import KvSnapshot, RequestTrace, StepRecord, TokenStep, Trace
from harness.core.verdict import Violation

BS, CHUNK, BLOCKS = 64, 128, 20


class Run:
    """A sendnn-inference 2.x run written step by step: the requests' lengths follow the
    tokens each step runs, the runner's TKV and the scheduler's prediction are the true ones
    unless a step says otherwise."""

    def __init__(self, prompts: dict[str, int], limit: int = 512, max_tokens: int = 128,
                 seqs: int = 4, pausing: bool = True) -> None:
        self.prompts, self.limit, self.seqs, self.pausing = prompts, limit, seqs, pausing
        self.max_tokens = max_tokens
        self.computed: dict[str, int] = {}
        self.steps: list[StepRecord] = []
        self.free = BLOCKS - 1
        self.promised = 0

    def decoding(self) -> list[str]:
        return [r for r, c in self.computed.items() if c >= self.prompts[r]]

    def step(self, run: dict[str, int], paused: tuple[str, ...] = (),
             waiting: tuple[str, ...] = (), tkv: int | None = None,
             predicted: int | None = None, prefilling: tuple[str, ...] = ()) -> StepRecord:
        decode = all(self.computed.get(r, -1) >= self.prompts[r] for r in run)
        if tkv is None:
            tkv = (batch_tkv([self.computed[r] + 1 for r in run], BS) if decode and run
                   else max((self.prompts[r] for r in run), default=0))
        for r, n in run.items():
            self.computed[r] = self.computed.get(r, 0) + n
        running = [r for r in self.computed if r not in paused]
        decoders = [r for r in running if self.computed[r] >= self.prompts[r]]
        if predicted is None:
            predicted = batch_tkv([self.computed[r] + 1 for r in decoders], BS)
        snap = KvSnapshot(source="vllm-scheduler", num_blocks=BLOCKS, pad_blocks=[0],
                          free_blocks=list(range(1, 1 + self.free)), block_size=BS,
                          counted_free=self.free, promised_total=self.promised,
                          pausing=self.pausing, chunk_size=CHUNK, predicted_tkv=predicted,
                          predicted_batch=decoders)
        record = StepRecord(step=len(self.steps), running=running, waiting=list(waiting),
                            paused=list(paused), executed=dict(run), tkv=tkv, kv=[snap],
                            prefilling=list(prefilling))
        self.steps.append(record)
        return record

    def trace(self) -> Trace:
        first = KvSnapshot(source="vllm-scheduler", num_blocks=BLOCKS, pad_blocks=[0],
                           free_blocks=list(range(1, BLOCKS)), block_size=BS, pausing=self.pausing,
                           chunk_size=CHUNK, predicted_tkv=0, predicted_batch=[])
        requests = {r: RequestTrace(r, [7] * n, [TokenStep(1, 0.0, {1: 0.0})] * self.max_tokens,
                                    finish_reason="length", max_tokens=self.max_tokens)
                    for r, n in self.prompts.items()}
        info = {"max_batch_tkv_limit": self.limit, "max_num_seqs": self.seqs,
                "max_model_len": 256}
        return Trace(target="spyre-eager-cp", requests=requests, steps=self.steps,
                     initial=StepRecord(step=-1, kv=[first]), info=info)


def names(violations: list[Violation]) -> list[str]:
    return [v.invariant for v in violations]


def two_decoding(limit: int = 512) -> Run:
    """r0 and r1 (64-token prompts) prefilled and decoding together from step 3."""
    run = Run({"r0": 64, "r1": 64}, limit=limit)
    run.step({"r0": 64}, waiting=("r1",))
    run.step({"r0": 1}, waiting=("r1",))
    run.step({"r1": 64})
    return run


# -- the rule


def test_batch_tkv_pads_every_request_to_the_largest_block_count():
    assert batch_tkv([], BS) == 0
    assert batch_tkv([65], BS) == 65
    assert batch_tkv([65, 128, 10], BS) == 128  # 10 tokens, one block, padded by one: 74
    assert batch_tkv([129, 127], BS) == 191  # 127 tokens padded by a block: 191
    assert batch_tkv([130, 40], BS) == 168  # 40 tokens padded by two blocks


def test_step_ranges_tell_runs_of_steps():
    assert step_ranges([4, 5, 6, 9, 11, 12]) == "4-6, 9, 11-12"
    assert step_ranges([]) == "-"


# -- a healthy run


def simulate(prompts: dict[str, int], limit: int, outputs: int) -> Run:
    """A scheduler that does it right: one prefill at a time, a decode between chunks, and at
    each decode as many requests (in id order) as fit the limit, the rest paused."""
    run = Run(prompts, limit=limit, max_tokens=outputs)
    queue = list(prompts)
    done: set[str] = set()
    last_prefill = False
    while len(done) < len(prompts):
        prefilling = [r for r, c in run.computed.items() if c < prompts[r]]
        decoders = [r for r in run.decoding() if r not in done]
        if prefilling or (queue and not (last_prefill and decoders)):
            r = prefilling[0] if prefilling else queue.pop(0)
            left = prompts[r] - run.computed.get(r, 0)
            run.step({r: min(CHUNK, left)}, waiting=tuple(queue))
            last_prefill = True
            continue
        batch: list[str] = []
        for r in decoders:
            lengths = [run.computed[x] + 1 for x in [*batch, r]]
            if len(lengths) * batch_tkv(lengths, BS) <= limit:
                batch.append(r)
        paused = tuple(r for r in decoders if r not in batch)
        run.step({r: 1 for r in batch}, paused=paused, waiting=tuple(queue))
        done |= {r for r in batch if run.computed[r] >= prompts[r] + outputs - 1}
        for r in done:
            run.computed.pop(r, None)
        last_prefill = False
    return run


def test_a_run_that_pauses_exactly_at_the_limit_passes():
    run = simulate({"r0": 64, "r1": 64, "r2": 64, "r3": 64}, limit=512, outputs=100)
    trace = run.trace()
    assert any(s.paused for s in trace.steps)  # the limit bound
    assert tkv_violations(trace) == []
    verdict = check_tkv_recorded(trace)
    assert verdict.ok and "with a pause" in verdict.why and "predictions compared" in verdict.why


def test_nothing_is_judged_where_no_limit_is_recorded():
    trace = simulate({"r0": 64, "r1": 64}, limit=128, outputs=4).trace()
    trace.info = {}
    trace.steps[4].tkv = 999
    assert tkv_violations(trace) == []
    assert check_tkv_recorded(trace).check == "kv_ledger.unrecorded"


# -- never missing


def test_a_batch_past_the_limit_is_flagged():
    run = two_decoding(limit=128)
    run.step({"r0": 1, "r1": 1})  # 2 x 66 > 128
    v = tkv_violations(run.trace())
    assert names(v) == ["tkv_limit"] and v[0].step == 3
    assert "the decode batch of 2 (r0, r1) ran at TKV 66: 2 x 66 = 132 tokens, over the batch" \
           " TKV limit 128" in v[0].message


def test_a_runner_tkv_beside_its_padding_is_flagged():
    run = two_decoding()
    run.step({"r0": 1, "r1": 1}, tkv=130)
    v = tkv_violations(run.trace())
    assert names(v) == ["runner_tkv", "tkv_prediction"]
    assert "ran the decode batch at TKV 130, but its requests' lengths (r0: 66, r1: 65)" \
           in v[0].message and "give 66" in v[0].message


def test_check_ledger_runs_the_tkv_checks():
    run = two_decoding(limit=128)
    run.step({"r0": 1, "r1": 1})
    verdict = check_ledger(run.trace())
    assert verdict.check == "kv_ledger.tkv_limit" and verdict.at == 3
    assert ">>" in verdict.details and "over the batch TKV limit 128" in verdict.details


# -- never early


def test_a_request_paused_with_room_is_flagged():
    run = two_decoding()
    run.step({"r0": 1}, paused=("r1",))  # 2 x 66 fits 512
    v = tkv_violations(run.trace())
    assert names(v) == ["paused_with_room"] and v[0].step == 3
    assert "request r1 was paused although the batch had room: with it, the batch of 2" \
           " (r0, r1) would have run at TKV 66: 2 x 66 = 132 tokens" in v[0].message


def test_a_request_paused_without_room_passes():
    run = two_decoding(limit=130)
    run.step({"r0": 1}, paused=("r1",))  # with it: 2 x 66 = 132 > 130
    assert tkv_violations(run.trace()) == []


def test_a_pause_counts_the_padding_a_longer_request_puts_before_it():
    # r1 is one block shorter than r0: put back, it is padded by a block (TKV 129, not 65).
    run = Run({"r0": 127, "r1": 64}, limit=257)
    run.step({"r0": 127}, waiting=("r1",))
    run.step({"r0": 1}, waiting=("r1",))
    run.step({"r1": 64})
    run.step({"r0": 1}, paused=("r1",))  # with it: 2 x (64 + 65) = 258 > 257
    assert tkv_violations(run.trace()) == []


def test_pauses_are_not_judged_at_a_prefill_step():
    run = Run({"r0": 64, "r1": 64, "r2": 64})
    run.step({"r0": 64}, waiting=("r1", "r2"))
    run.step({"r0": 1}, waiting=("r1", "r2"))
    run.step({"r1": 64}, waiting=("r2",))
    run.step({"r0": 1, "r1": 1}, waiting=("r2",))
    run.step({"r2": 64}, paused=("r1",))  # still paused while r2 prefills: no decode ran
    assert "paused_with_room" not in names(tkv_violations(run.trace()))


# -- the prediction


def test_a_prediction_the_runner_does_not_meet_is_flagged():
    run = two_decoding()
    run.steps[-1].kv[0].predicted_tkv = 60
    run.step({"r0": 1, "r1": 1})
    v = tkv_violations(run.trace())
    assert names(v) == ["tkv_prediction"] and v[0].step == 3
    assert "after step 2 the scheduler predicted TKV 60 for the next decode of r0, r1, but the" \
           " runner ran that batch at TKV 66" in v[0].message


def test_a_prediction_for_another_batch_is_not_compared():
    run = two_decoding()
    run.steps[-1].kv[0].predicted_tkv = 60  # for r0 and r1, but only r0 decodes
    run.step({"r0": 1}, paused=("r1",), tkv=66)
    assert "tkv_prediction" not in names(tkv_violations(run.trace()))


# -- hold-backs


def held_back(limit: int = 512, seqs: int = 4, **step: object) -> Run:
    """r0 and r1 decoding, r2 (64 tokens) waiting at step 4, a decode step."""
    run = Run({"r0": 64, "r1": 64, "r2": 64}, limit=limit, seqs=seqs)
    run.step({"r0": 64}, waiting=("r1", "r2"))
    run.step({"r0": 1}, waiting=("r1", "r2"))
    run.step({"r1": 64}, waiting=("r2",))
    run.step({"r0": 1, "r1": 1}, waiting=("r2",))
    run.step({"r0": 1, "r1": 1}, waiting=("r2",), **step)  # type: ignore[arg-type]
    return run


def test_a_newcomer_held_back_with_room_is_flagged():
    v = tkv_violations(held_back().trace())
    assert names(v) == ["held_back_with_room"] and v[0].step == 4
    assert v[0].message.startswith("request r2 was held back although nothing was prefilling"
                                   " or paused, the batch had room (2 of 4 running)")
    assert "with it the batch of 3 would run at TKV 68 at most: 3 x 68 = 204 tokens, within" \
           " the batch TKV limit 512" in v[0].message


def test_hold_backs_repeat_as_ranges():
    run = held_back()
    for _ in range(3):
        run.step({"r0": 1, "r1": 1}, waiting=("r2",))
    v = tkv_violations(run.trace())
    assert names(v) == ["held_back_with_room"]
    assert v[0].message.endswith("(again at steps 5-7)")


def test_a_hold_back_has_its_reasons():
    # joining would pass the limit: 3 x 68 > 200
    assert tkv_violations(held_back(limit=200).trace()) == []
    # the limit cannot bind (3 x 256 <= 768): the block checks' step, not this one's
    assert tkv_violations(held_back(limit=768).trace()) == []
    # the batch is full
    assert tkv_violations(held_back(seqs=2).trace()) == []
    # the blocks are short: 3 needed, 2 free and not promised
    run = held_back()
    run.steps[3].kv[0].promised_total = run.steps[3].kv[0].counted_free - 2
    assert tkv_violations(run.trace()) == []
    # paused requests resume first
    run = held_back()
    run.steps[3].paused = ["r1"]
    assert "held_back_with_room" not in names(tkv_violations(run.trace()))
    # a prefill under way, by the engine's own record
    run = held_back()
    run.steps[3].prefilling = ["r1"]
    assert tkv_violations(run.trace()) == []
    # pausing off: the plugin applies the limit at admission, by its worst case
    run = held_back()
    for s in run.steps:
        s.kv[0].pausing = False
    assert tkv_violations(run.trace()) == []


def test_a_decode_follows_a_prefill_step():
    run = Run({"r0": 64, "r1": 64}, limit=512)
    run.step({"r0": 64}, waiting=("r1",))
    run.step({"r0": 1}, waiting=("r1",))  # after r0's prefill, a decode: r1 may wait
    assert tkv_violations(run.trace()) == []


# -- folding


def test_repeats_fold_per_invariant_and_request():
    vs = [Violation("paused_with_room", "request r1 was paused", 3, "s"),
          Violation("paused_with_room", "request r2 was paused", 4, "s"),
          Violation("paused_with_room", "request r1 was paused", 4, "s"),
          Violation("tkv_limit", "over", 5, "s"), Violation("tkv_limit", "over", 9, "s")]
    out = folded(vs)
    assert [(v.invariant, v.step) for v in out] == [("paused_with_room", 3),
                                                   ("paused_with_room", 4), ("tkv_limit", 5)]
    assert out[0].message.endswith("(again at steps 4)")
    assert out[2].message == "over (again at steps 9)"


def test_lengths_count_the_prefix_cache_hit():
    # r1 starts with 64 cached tokens: its prompt of 100 needs 36 more, then it decodes.
    run = Run({"r0": 64, "r1": 100})
    run.step({"r0": 64}, waiting=("r1",))
    run.step({"r0": 1}, waiting=("r1",))
    run.computed["r1"] = 64
    run.step({"r1": 36})
    run.step({"r0": 1, "r1": 1}, tkv=batch_tkv([66, 101], BS))
    trace = run.trace()
    trace.requests["r1"].num_cached_tokens = 64
    assert tkv_violations(trace) == []


def test_a_batch_with_an_aborted_request_is_judged_by_its_length():
    # r1 is aborted after the step below: the trace keeps it apart (Trace.aborted), and its
    # length is still what it computed, so the runner's TKV one block high is seen
    run = two_decoding()
    run.step({"r0": 1, "r1": 1}, tkv=130)
    trace = run.trace()
    gone = trace.requests.pop("r1")
    gone.aborted_at = 4
    trace.aborted = {"r1": gone}
    v = tkv_violations(trace)
    assert names(v) == ["runner_tkv", "tkv_prediction"]
    assert "its requests' lengths (r0: 66, r1: 65)" in v[0].message


def test_a_preempted_request_is_as_long_as_it_computed_again():
    # r1 decodes to 66 tokens, is preempted, and computes its 66 tokens again (no prefix
    # caching: from the start); at its next decode it holds 67 tokens, not 66 + 66 + 1
    run = two_decoding()
    run.step({"r0": 1, "r1": 1})
    run.step({"r0": 1, "r1": 1})
    run.steps.append(StepRecord(step=len(run.steps), preempted=["r1"], executed={"r0": 1},
                                tkv=batch_tkv([68], BS), kv=run.steps[-1].kv))
    run.computed["r0"] += 1
    run.computed["r1"] = 0
    run.step({"r1": 66}, prefilling=())
    run.step({"r0": 1, "r1": 1}, tkv=batch_tkv([69, 67], BS))
    trace = run.trace()
    v = [x for x in tkv_violations(trace) if x.invariant == "runner_tkv"]
    assert v == []


def test_an_aborted_request_is_as_long_as_its_prefix_cache_hit_made_it():
    # r3 (prompt 203) is served its first block from the cache: its prefill runs 128 + 11
    # tokens. The engine reads an aborted request's hit as 0 (vLLM 0.28 keeps it in the
    # request's prefill stats, not on the Request), so its length comes from what its prefill
    # steps left unrun. At 211 tokens beside r4 at 97, r4 is left-padded by 2 blocks: 2 x 225
    # = 450 is past the limit 448, and pausing r3 is right (a length 64 short gave TKV 161)
    run = Run({"r3": 203, "r4": 89}, limit=448)
    run.step({"r4": 89}).prefilled = ["r4"]
    run.computed["r3"] = 64
    run.step({"r3": 128}).prefilled = ["r3"]
    run.step({"r3": 11}).prefilled = ["r3"]
    for _ in range(7):
        run.step({"r3": 1, "r4": 1}).prefilled = []
    run.step({"r4": 1}, paused=("r3",)).prefilled = []
    trace = run.trace()
    gone = trace.requests.pop("r3")
    gone.aborted_at, gone.num_cached_tokens = len(run.steps), 0
    trace.aborted = {"r3": gone}
    assert tkv_violations(trace) == []
    # with r3 given room, the same pause is flagged
    trace.info["max_batch_tkv_limit"] = 450
    assert names(tkv_violations(trace)) == ["paused_with_room"]
