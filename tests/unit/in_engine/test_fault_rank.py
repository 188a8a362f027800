"""``rank=`` in a fault spec: a rank of an engine the run starts, or refused before any engine
starts (``check_fault_rank``): a rank no engine has installs the fault nowhere, and the run
passes having proved nothing. Generated specs and tensor-parallel sizes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.in_engine.faults import check_fault_rank, check_fault_spec, check_fault_specs

SPEC = "scale-partial-sum"


@pytest.mark.parametrize("spec, sizes, message", [
    (f"{SPEC}:rank=5", [1], f"fault '{SPEC}:rank=5': rank=5 is no rank of this run's engines,"
     " which run 1 rank each (rank 0 only), so the fault would be installed nowhere; give rank=0,"
     " or run engines of more ranks"),
    (f"{SPEC}:rank=2", [1, 2], "which run 1 or 2 ranks each (ranks 0 to 1), so the fault would be"
     " installed nowhere; give a rank from 0 to 1"),
    (f"{SPEC}:factor=2,rank=4", [4, 1], "which run 1 or 4 ranks each (ranks 0 to 3)"),
    (f"{SPEC}:rank=one", [2], "rank='one' is no rank; give a tensor-parallel rank, 0 for the"
     " first"),
])
def test_a_rank_no_engine_of_the_run_has_is_refused_naming_the_ranks(spec, sizes, message):
    with pytest.raises(ValueError) as e:
        check_fault_rank(spec, sizes)
    assert message in str(e.value)


@pytest.mark.parametrize("spec, sizes", [
    (f"{SPEC}:rank=1", [1, 2]), (f"{SPEC}:rank=0", [1]), (SPEC, [1]), (f"{SPEC}:factor=2", []),
    (f"{SPEC}:rank=3", [4]),
])
def test_a_rank_an_engine_has_or_none_is_accepted(spec, sizes):
    check_fault_rank(spec, sizes)


def test_rank_is_ascii_digits_in_options_and_inventories():
    # int() reads '٣' (an Arabic-Indic 3) and str.isdigit() accepts '²', which int() refuses:
    # an engine would have raised, or installed the fault in a rank nobody wrote.
    for rank in ("\u00b2", "\u0663", "-1", "1.0", ""):
        with pytest.raises(ValueError, match="is no rank"):
            check_fault_spec(f"{SPEC}:rank={rank}", [], [])
        with pytest.raises(ValueError, match="is no rank"):
            check_fault_specs(f"{SPEC}:rank={rank}")


RANKS = st.one_of(st.integers(min_value=0, max_value=9).map(str),
                  st.text(alphabet=st.characters(blacklist_characters=",:;="), max_size=4))


@settings(max_examples=300, deadline=None)
@given(rank=RANKS, sizes=st.lists(st.integers(min_value=1, max_value=8), max_size=4),
       factor=st.booleans())
def test_a_random_rank_is_accepted_exactly_when_an_engine_has_it(rank, sizes, factor):
    spec = f"{SPEC}:" + ("factor=1.5," if factor else "") + f"rank={rank}"
    ranks = max(sizes or [1])
    wanted = rank.strip()
    good = wanted.isascii() and wanted.isdigit() and int(wanted) < ranks
    try:
        check_fault_rank(spec, sizes)
    except ValueError as e:
        message = str(e)
        assert not good, message
        assert message.startswith(f"fault {spec!r}: rank=") and "\n" not in message
        assert len(message) < 400
    else:
        assert good, (spec, sizes)
