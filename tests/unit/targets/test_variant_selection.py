"""Target selection (``--target``): an unknown name names the known variants."""

import pytest

from harness.targets.variants import VARIANTS, select_variants


def test_unknown_target_selection():
    with pytest.raises(ValueError, match=r"unknown target 'spyre-foo'.*spyre-eager-cb"):
        select_variants("spyre-foo")
    assert [v.id for v in select_variants("cb")] == ["spyre-eager-cb", "spyre-sendnn-cb"]
    assert {v.id for v in select_variants("spyre-eager")} == {
        "spyre-eager-sb", "spyre-eager-cb", "spyre-eager-cp", "spyre-eager-pc"}
    assert len(select_variants("")) == len([v for v in VARIANTS.values() if not v.opt_in])


def test_opt_in_variants_run_only_where_named() -> None:
    """Pausing off (np) is a control: not in an unnamed selection, nor in a kind or prefix."""
    from harness.targets.variants import select_variants

    assert "spyre-eager-np" not in {v.id for v in select_variants(None)}
    assert "spyre-eager-np" not in {v.id for v in select_variants("spyre")}
    assert "spyre-eager-np" not in {v.id for v in select_variants("spyre-eager")}
    assert [v.id for v in select_variants("np")] == ["spyre-eager-np", "spyre-sendnn-np"]
    assert [v.id for v in select_variants("spyre-eager-np")] == ["spyre-eager-np"]
    assert {v.id for v in select_variants("cp,np")} == {
        "spyre-eager-cp", "spyre-sendnn-cp", "spyre-eager-np", "spyre-sendnn-np"}
