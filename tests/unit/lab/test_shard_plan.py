"""Balanced shards: engine groups dealt by measured duration, the count fallback, the
durations files, and determinism."""

from __future__ import annotations

import json

import pytest

from harness.lab.shard_plan import (
    DurationsError,
    durations_for,
    junit_address,
    load_durations,
    plan_shards,
    write_durations,
)

GROUPS = {
    "vllm-cpu|tiny-llama": [f"suites/test_a.py::t[{i}-vllm-cpu]" for i in range(10)],
    "spyre-eager-cb|tiny-llama": [f"suites/test_a.py::t[{i}-cb]" for i in range(10)],
    "spyre-eager-sb|tiny-llama": [f"suites/test_a.py::t[{i}-sb]" for i in range(2)],
    "spyre-eager-cp|tiny-llama": [f"suites/test_a.py::t[{i}-cp]" for i in range(2)],
}


def seconds(group_seconds: dict[str, float]) -> dict[str, float]:
    return {nid: group_seconds[g] / len(ids) for g, ids in GROUPS.items() if g in group_seconds
            for nid in ids}


def test_without_durations_the_split_balances_counts_and_keeps_groups_whole():
    plan = plan_shards(GROUPS, 2)
    assert plan.by == "count" and plan.fingerprint == "by count"
    assert sorted(plan.tests) == [12, 12]
    assert set(plan.assignment) == set(GROUPS)


def test_with_durations_the_split_balances_time_not_counts():
    # Few slow sb/cp tests against many fast ones: by count would put 12 and 12.
    d = seconds({"vllm-cpu|tiny-llama": 100, "spyre-eager-cb|tiny-llama": 100,
                 "spyre-eager-sb|tiny-llama": 190, "spyre-eager-cp|tiny-llama": 10})
    plan = plan_shards(GROUPS, 2, d)
    assert plan.by == "time" and plan.fingerprint.startswith("by time sha256:")
    assert sorted(round(x) for x in plan.loads) == [200, 200]
    assert plan.shard_of("spyre-eager-sb|tiny-llama") != plan.shard_of("vllm-cpu|tiny-llama")


def test_the_plan_is_deterministic_whatever_the_collection_order():
    d = seconds({g: 10.0 for g in GROUPS})  # all equal: ties broken by shard, then name
    a = plan_shards(GROUPS, 3, d)
    b = plan_shards(dict(reversed(list(GROUPS.items()))), 3, d)
    assert a.assignment == b.assignment and a.fingerprint == b.fingerprint
    assert sorted(a.assignment.values()) == [1, 1, 2, 3]


def test_tests_without_a_duration_weigh_the_median():
    d = seconds({"vllm-cpu|tiny-llama": 100, "spyre-eager-cb|tiny-llama": 100})
    plan = plan_shards(GROUPS, 2, d)
    assert plan.unknown == 4  # sb and cp: 4 tests at the median 10 s
    assert sum(plan.loads) == pytest.approx(240)
    assert "4 test(s) without a measured duration" in plan.describe()


def test_durations_files_round_trip_and_junit_is_read_by_its_address(tmp_path):
    path = write_durations(tmp_path / "durations.json", {"suites/a.py::t[x]": 1.5}, "test")
    assert load_durations(path) == {"suites/a.py::t[x]": 1.5}
    junit = tmp_path / "junit.xml"
    classname, name = junit_address("suites/test_a.py::t[0-cb]")
    assert (classname, name) == ("suites.test_a", "t[0-cb]")
    junit.write_text(f'<testsuites><testsuite><testcase classname="{classname}" name="{name}"'
                     ' time="7.5"/></testsuite></testsuites>')
    plan = plan_shards(GROUPS, 2, load_durations(junit))
    assert plan.by == "time" and plan.unknown == 23


@pytest.mark.parametrize("text", ["{", "[1, 2]", json.dumps({"tests": {"a": "slow"}})])
def test_a_broken_durations_file_is_an_error_that_says_what_to_do(tmp_path, text):
    path = tmp_path / "durations.json"
    path.write_text(text)
    with pytest.raises(DurationsError, match="durations.json.*hil report"):
        load_durations(path)
    with pytest.raises(DurationsError):
        durations_for(str(path), tmp_path)


def test_durations_come_from_the_option_then_the_reports_folder_then_nowhere(tmp_path):
    assert durations_for("", tmp_path) == ({}, "none")
    assert durations_for(str(tmp_path / "absent.json"), tmp_path)[0] == {}
    write_durations(tmp_path / "durations.json", {"a": 2.0}, "test")
    assert durations_for("", tmp_path) == ({"a": 2.0}, str(tmp_path / "durations.json"))
