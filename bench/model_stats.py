"""How confident the tiny models are where the suites compare tokens.

    .venv/bin/python bench/model_stats.py [--fresh] [--model NAME]

For each tiny model: its build time (``--fresh`` builds into an empty cache so
the time is real; otherwise the cached folder is used), then the CPU reference's
greedy positions over the token-equality prompt set and the KV suites' shaped
scenarios, with the median, p10 and p90 of the top-1 probability and the
near-tie exposure (harness.checks.exposure). A local model folder works too.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fixtures.models import DEFAULT_CACHE_DIR, MODEL_SPECS, build_model  # noqa: E402
from harness.checks.exposure import DEFAULT_TOL, Exposure, exposure_of  # noqa: E402
from harness.core.trace import RequestTrace  # noqa: E402

TOP_K = 5


def reference_requests(tokenizer: Any) -> list[tuple[tuple[int, ...], int]]:
    """(prompt ids, max_tokens) of every distinct request the token-equality and KV suites
    send: all cases of the token-equality prompt set and the suites' shaped scenarios."""
    from bench.bench_variants import cpu_kinds
    from harness.scenario.prompts import PromptSet
    from suites import test_block_freeing, test_capacity, test_no_recompute

    scenarios = []
    ps = PromptSet.load("token_equality")
    scenarios += [ps.scenario(case, tokenizer) for case in ps.case_ids()]
    model = SimpleNamespace(tokenizer=tokenizer)
    from harness.scenario.prompts import EngineLimits

    limits = EngineLimits(test_block_freeing.MAX_MODEL_LEN, test_block_freeing.MAX_NUM_SEQS,
                          cp_chunk=128)
    # the CPU's limits: a test's own (the suites' hil.limits changes them on a card only)
    cpu = SimpleNamespace(limits=lambda variant, ctx, seqs, cp_chunk=128, round_batch=False:
                          EngineLimits(ctx, seqs, cp_chunk=cp_chunk))
    scenarios += [
        test_block_freeing.shaped_scenario(name, tokenizer, shapes, limits)
        for name, shapes in test_block_freeing.SCENARIOS.items()
    ]
    scenarios += [
        test_no_recompute.full_batch_scenario(cpu, model, SimpleNamespace(target=target), seqs,
                                              prompt_len)
        # The request lengths differ per target kind: each kind that runs here (on the CPU).
        for target in cpu_kinds()
        for seqs in (2, 4)
        for prompt_len in (63, 64, 65)
    ]
    scenarios.append(test_capacity.full_length_scenario(model))
    seen: dict[tuple[tuple[int, ...], int], None] = {}
    for s in scenarios:
        for r in s.requests:
            seen.setdefault((tuple(r.prompt_token_ids), r.max_tokens), None)
    return list(seen)


def reference_traces(model_dir: Path) -> list[RequestTrace]:
    """The CPU reference's greedy traces (uncached) for ``reference_requests``."""
    import torch
    from transformers import AutoTokenizer

    from harness.reference.cache import ReferenceCache
    from harness.reference.runner import ReferenceRunner

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    runner = ReferenceRunner(model_dir, "unhashed", ReferenceCache(Path("."), enabled=False))
    traces = []
    threads = torch.get_num_threads()
    # One token at a time through a tiny model: threads only contend (10x slower when loaded).
    torch.set_num_threads(1)
    try:
        for i, (ids, max_tokens) in enumerate(reference_requests(tokenizer)):
            steps = runner.greedy(list(ids), max_tokens, TOP_K)
            traces.append(RequestTrace(request_id=str(i), prompt_token_ids=list(ids), steps=steps))
    finally:
        torch.set_num_threads(threads)
    return traces


def model_exposure(model_dir: Path, label: str, tol: float = DEFAULT_TOL) -> Exposure:
    """Exposure of the model in ``model_dir`` over the suites' reference positions."""
    return exposure_of(label, reference_traces(model_dir), tol=tol)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append",
                        help="tiny model name or model folder (repeatable; default: all tiny models)")
    parser.add_argument("--fresh", action="store_true",
                        help="build tiny models into an empty cache, to time the build")
    parser.add_argument("--near-tie-tol", type=float, default=DEFAULT_TOL)
    args = parser.parse_args(argv)
    failed = False
    with tempfile.TemporaryDirectory(prefix="hil-model-stats-") as tmp:
        cache = Path(tmp) if args.fresh else DEFAULT_CACHE_DIR
        for value in args.model or list(MODEL_SPECS):
            t0 = time.perf_counter()
            folder = build_model(value, cache) if value in MODEL_SPECS else Path(value)
            built = time.perf_counter() - t0
            exposure = model_exposure(folder, value, args.near_tie_tol)
            build = f"build {built:.1f}s" + ("" if args.fresh else " (cached unless absent)")
            print(f"{exposure.line()}; {build}", flush=True)
            warning = exposure.warning()
            if warning:
                print(f"  WARNING: {warning}", flush=True)
                failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
