"""hil explore refuses bad input before any engine starts (exit 2, one line naming what is
wrong), and hil nightly takes --explore SECONDS."""

from __future__ import annotations

import pytest

from harness import cli


def explore(tmp_path, *args: str) -> list[str]:
    return ["explore", "--reports-dir", str(tmp_path), "--budget", "5", *args]


@pytest.mark.parametrize("args, words", [
    (["--target", "bogus"], "hil explore: --target: unknown target 'bogus'"),
    (["--target", "spyre-eager-sb"], "names no target variant whose KV ledgers are read at"
                                     " every step (spyre-eager-sb)"),
    (["--model", "tiny-llama,tiny-granite"], "give one model"),
    (["--stack", "nope"], "hil explore: --stack: no stack 'nope'"),
    (["--inject-fault", "no-such-fault"], "hil explore: --inject-fault: "),
])
def test_bad_input_is_refused_before_any_engine_starts(tmp_path, capsys, args, words):
    assert cli.main(explore(tmp_path, *args)) == 2
    err = capsys.readouterr().err
    assert words in err, err
    assert not (tmp_path / "explore").exists()


@pytest.mark.parametrize("budget", ["0", "-3", "soon"])
def test_a_budget_not_above_zero_is_refused(tmp_path, capsys, budget):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["explore", "--reports-dir", str(tmp_path), "--budget", budget])
    assert exit_.value.code == 2
    assert "--budget" in capsys.readouterr().err


def test_a_fault_from_the_environment_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HIL_FAULTS", "forget-free")
    assert cli.main(explore(tmp_path)) == 2
    assert "env HIL_FAULTS='forget-free'" in capsys.readouterr().err


def test_the_budget_is_required(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["explore", "--reports-dir", str(tmp_path)])
    assert exit_.value.code == 2
    assert "--budget" in capsys.readouterr().err


def test_nightly_takes_an_explore_budget():
    parsers = cli.subcommand_parsers(cli.build_parser())
    args = parsers["nightly"].parse_args(["--explore", "90"])
    assert args.explore == 90.0
    assert parsers["nightly"].parse_args([]).explore is None
    with pytest.raises(SystemExit):
        parsers["nightly"].parse_args(["--explore", "0"])


def test_without_hypothesis_the_search_is_refused_naming_the_fix(monkeypatch):
    """An installed copy on a stack without hypothesis: ``hil`` itself works, ``hil explore``
    is refused before anything starts (exit 2), saying where the search runs."""
    import sys

    from harness.explore import command

    monkeypatch.setitem(sys.modules, "hypothesis", None)  # import hypothesis -> ImportError
    with pytest.raises(command.BadInput, match="the search needs hypothesis, which .* lacks:"
                       " run hil explore from the default stack's venv"):
        command._search_library()


def test_a_search_that_ran_no_example_is_no_all_clear(tmp_path, capsys):
    """Every geometry refused (an engine that never starts): exit 2 with the reason's pointer,
    never 0 "no findings"; a search that ran examples and found nothing exits 0."""
    from collections import Counter

    from harness.explore.command import report
    from harness.explore.findings import RunInfo
    from harness.explore.search import SearchResult, Tally

    info = RunInfo(seed=0, budget=10, shrink_budget=1, model="tiny-llama", stack="default",
                   explore_dir=tmp_path)
    refused = Tally(geometries_refused=Counter({"the engine did not start: ...": 256}))
    assert report(info, [("spyre-eager-cp", SearchResult([], refused, 10.0, "spent"))], []) == 2
    assert "no example ran (every geometry refused" in capsys.readouterr().err
    ran = Tally(examples=3, passed=3, geometries=1)
    assert report(info, [("spyre-eager-cp", SearchResult([], ran, 10.0, "spent"))], []) == 0


def test_tensor_parallel_sizes_are_whole_positive_numbers(tmp_path, capsys):
    for bad in ("0", "two", ","):
        with pytest.raises(SystemExit):
            cli.main(explore(tmp_path, "--tensor-parallel", bad))
        assert "is no list of ranks per engine" in capsys.readouterr().err
