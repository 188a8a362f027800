"""The pure parts of the 2.x admission faults (harness/targets/spyre/faults_2x.py)."""

from __future__ import annotations

from types import SimpleNamespace

from harness.targets.spyre.faults_2x import ClampedPromises, first_promised


def test_first_promised_takes_the_first_new_request_with_a_promise():
    new = [SimpleNamespace(req_id="a"), SimpleNamespace(req_id="b")]
    assert first_promised(new, {"a": 0, "b": 2}) == "b"
    assert first_promised(new, {"a": 0, "b": 2}, at_least=0) == "a"
    assert first_promised([], {"a": 1}) is None


def test_the_short_promise_stays_at_zero_and_its_block_goes_back_on_the_total():
    owner = SimpleNamespace(total_reserved_blocks=2)
    promises = ClampedPromises({"a": 0, "b": 2}, owner, "a")
    # the plugin discounts the total first, then the request's promise
    owner.total_reserved_blocks -= 1
    promises["a"] -= 1
    assert promises["a"] == 0 and owner.total_reserved_blocks == 2 == sum(promises.values())
    promises["b"] -= 1  # other requests are untouched
    assert promises["b"] == 1 and owner.total_reserved_blocks == 2
    assert promises.pop("a") == 0 and dict(promises) == {"b": 1}
