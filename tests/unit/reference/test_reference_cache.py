"""A bad reference cache entry (wrong shape, other key, too few steps, another prompt) is
recomputed, named, and replaced by a good one."""

import json
from pathlib import Path

import pytest

from harness.core.trace import TokenStep
from harness.reference.cache import ReferenceCache, cache_key
from harness.reference.runner import ReferenceRunner


class CountingRunner(ReferenceRunner):
    """The reference runner with the model replaced by a counter (harness internals only)."""

    computed = 0

    @property
    def stack(self):
        return {"torch": "t", "transformers": "x", "impl": "i"}

    def greedy(self, prompt_token_ids, max_tokens, top_k):
        CountingRunner.computed += 1
        return [TokenStep(token_id=7, logprob=-0.1, top_logprobs={7: -0.1}) for _ in range(max_tokens)]


REQUEST = {"request_id": "r0", "prompt_token_ids": [1, 2, 3], "max_tokens": 3}


def cached_entry(cache: ReferenceCache, runner: ReferenceRunner) -> Path:
    fields = {"model": "m", "prompt_token_ids": [1, 2, 3], "max_tokens": 3, "top_k": 2,
              "greedy": True, "stack": runner.stack}
    return cache.path_for(cache_key(fields))


@pytest.mark.parametrize("damage,why", [
    (lambda e: {"key_fields": e["key_fields"], "value": {"steps": "oops"}}, "wrong shape"),
    (lambda e: {"key_fields": e["key_fields"], "value": {}}, "wrong shape at the entry: 'request_id'"),
    (lambda e: {**e, "key_fields": {**e["key_fields"], "max_tokens": 9}}, "key fields do not match"),
    (lambda e: {**e, "value": {**e["value"], "steps": e["value"]["steps"][:1]}},
     "1 steps stored, 3 asked for"),
    (lambda e: {**e, "value": {**e["value"], "prompt_token_ids": [9]}}, "prompt is not the one"),
    (lambda e: [1, 2], "not an object"),
])
def test_bad_reference_entry_is_recomputed_and_named(tmp_path, damage, why):
    cache = ReferenceCache(tmp_path / "ref")
    runner = CountingRunner(tmp_path, "m", cache)
    CountingRunner.computed = 0
    first = runner.run([REQUEST], top_k=2)
    path = cached_entry(cache, runner)
    entry = json.loads(path.read_text())
    path.write_text(json.dumps(damage(entry)))
    again = CountingRunner(tmp_path, "m", ReferenceCache(tmp_path / "ref"))
    second = again.run([REQUEST], top_k=2)
    assert CountingRunner.computed == 2
    assert second.requests["r0"].token_ids == first.requests["r0"].token_ids == [7, 7, 7]
    (bad,) = again.cache.bad
    assert bad.startswith(f"{path}: ") and why in bad and bad.endswith("; recomputed")
    assert json.loads(path.read_text()) == entry  # the good entry is back
    third = ReferenceCache(tmp_path / "ref")
    CountingRunner(tmp_path, "m", third).run([REQUEST], top_k=2)
    assert (third.hits, third.bad, CountingRunner.computed) == (1, [], 2)
