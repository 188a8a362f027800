"""Target selection (``--target``): an unknown name names the known variants."""

import pytest

from harness.targets.variants import VARIANTS, select_variants


def test_unknown_target_selection():
    with pytest.raises(ValueError, match=r"unknown target 'spyre-foo'.*spyre-eager-cb"):
        select_variants("spyre-foo")
    assert [v.id for v in select_variants("cb")] == ["spyre-eager-cb", "spyre-sendnn-cb"]
    assert {v.id for v in select_variants("spyre-eager")} == {
        "spyre-eager-sb", "spyre-eager-cb", "spyre-eager-cp", "spyre-eager-pc"}
    assert len(select_variants("")) == len(VARIANTS)
