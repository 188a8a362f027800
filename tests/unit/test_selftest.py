"""`hil selftest` without engines: which cases a host gets, how a child run is judged,
the exit rule, and its results as an Allure suite of their own."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.in_engine.faults import FAULTS
from harness.report.categories import classify
from harness.report.results import labels_of, load_results
from harness.selftest import (
    Case,
    Outcome,
    cases_for,
    cpu_cases,
    device_cases,
    device_only_faults,
    host_kinds,
    judge,
    table,
    uncaught_families,
    write_allure,
)
from harness.targets import KINDS, all_variants, selftest_modules

CASE = Case("perturb-logit:position=5", "vllm-cpu", "suites/test_token_equality.py",
            "single", "token mismatch")


def junit(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "junit.xml"
    path.write_text(f"<testsuites><testsuite>{body}</testsuite></testsuites>")
    return path


def test_every_fault_family_has_a_case_on_the_cpu_paths():
    assert {c.family for c in cpu_cases()} == set(FAULTS) - set(device_only_faults())


def test_each_kind_declares_the_cases_of_its_own_targets():
    """A case lives with the kind whose target it runs on; a device case runs on one of the
    kind's variants that need a device, with the device required."""
    assert selftest_modules(), "no kind declares a selftest case"
    for name, module in selftest_modules().items():
        for case in getattr(module, "CASES", ()):
            assert all_variants()[case.target].target == name, (name, case)
        for case in getattr(module, "DEVICE_CASES", ()):
            variant = all_variants()[case.target]
            assert variant.target == name and KINDS[name].needs_device(variant), (name, case)
            assert "--require-device" in case.extra, case
    cases = [*cpu_cases(), *(c for k in KINDS for c in device_cases(k))]
    assert len(set(cases)) == len(cases), "a case is declared twice"


def test_cards_add_their_cases_and_a_family_can_be_chosen():
    cpu = cases_for([])
    spyre = cases_for(["spyre"])
    assert len(spyre) > len(cpu)
    assert {c.target for c in spyre} - {c.target for c in cpu} == {"spyre-sendnn-cp"}
    assert all("--require-device" in c.extra for c in spyre if c.target == "spyre-sendnn-cp")
    assert {c.family for c in cases_for([], ["hang-engine"])} == {"hang-engine"}
    with pytest.raises(ValueError, match="unknown fault.*known: "):
        cases_for([], ["no-such-fault"])
    for kind in KINDS:  # every kind's device cases, and nothing else, join the CPU paths'
        assert cases_for([kind]) == [*cpu_cases(), *device_cases(kind)]


def test_a_fault_with_no_case_off_its_device_says_what_proves_it():
    fault, why = next(iter(device_only_faults().items()))
    with pytest.raises(ValueError, match=f"--fault {fault}: no selftest case on this host"
                       rf" \(device kinds: none, the CPU paths\); {fault} {re.escape(why)}"):
        cases_for([], [fault])


def test_the_host_kinds_are_those_with_a_device_their_device_variants_run_on(tmp_path):
    inv = tmp_path / "inv.toml"
    inv.write_text('[[device]]\nid = "stand-in"\nkind = "spyre"\nbackend = "eager"\n')
    assert host_kinds(str(inv)) == []  # a CPU-mode stand-in is no card
    inv.write_text('[[device]]\nid = "card0"\nkind = "spyre"\nfeatures = ["cb"]\n'
                   '[[device]]\nid = "n0"\nkind = "neuron"\n'
                   '[[device]]\nid = "cpu0"\nkind = "cpu"\n')
    assert host_kinds(str(inv)) == ["neuron", "spyre"]


def test_the_expected_categories_are_real_categories():
    # Each case's category is one classify() gives for a message that family produces.
    samples = {
        "token mismatch": "harness.core.verdict.VerdictFailed: [check token_equality] token mismatch: vllm-cpu at position 5",
        "logprob drift": "harness.core.verdict.VerdictFailed: [check logprob_closeness] logprobs differ",
        "distribution drift": "harness.core.verdict.VerdictFailed: [check distribution_distance]"
                              " the device's distribution is farther from the reference's",
        "sampler not greedy": "harness.core.verdict.VerdictFailed: [check greedy_self_consistency]"
                              " greedy self-consistency: request r0 position 13 chose token 1",
        "block leak": "harness.core.verdict.VerdictFailed: [check kv_ledger.conservation] kv invariant conservation broken at step 3",
        "scheduling": "harness.core.verdict.VerdictFailed: [check kv_ledger.hold_back] kv invariant hold_back broken at step 5",
        "recompute": "harness.core.verdict.VerdictFailed: [check full_batch] full batch never reached: max_num_seqs=4",
        "capacity": "harness.core.verdict.VerdictFailed: [check capacity] KV cache too small for a"
                    " full batch: the device allocated 8 blocks",
        "timeout": "harness.engine.host.EngineTimeout: engine gave no answer within 15 s; killed it",
        "engine crash / harness error":
            "harness.engine.host.EngineStartError: engine died with exit code 3 while starting",
    }
    for case in cases_for(list(KINDS)):
        assert classify("failed", samples[case.expect]) == case.expect, case


def test_a_failure_of_the_expected_category_is_a_catch(tmp_path):
    path = junit(tmp_path, '<testcase classname="suites.test_token_equality" name="t[x]">'
                 '<failure message="VerdictFailed: [check token_equality] token mismatch: at position 5">x</failure>'
                 "</testcase>")
    assert judge(CASE, 1, path) == ("caught", "suites.test_token_equality::t[x]",
                                    "token mismatch", "VerdictFailed: [check token_equality] token mismatch: at position 5")


def test_a_pass_a_wrong_category_or_no_test_is_not_a_catch(tmp_path):
    passed = junit(tmp_path, '<testcase classname="a" name="t"/>')
    assert judge(CASE, 0, passed)[0] == "uncaught"
    wrong = junit(tmp_path, '<testcase classname="a" name="t"><error message="harness.engine.host.'
                  'EngineStartError: engine died with exit code 3 while starting"/></testcase>')
    verdict, _, category, _ = judge(CASE, 1, wrong)
    assert (verdict, category) == ("wrong category", "engine crash / harness error")
    assert judge(CASE, 5, tmp_path / "absent.xml")[0] == "not run"
    # A skipped selection (a mode the stack does not have) is not a catch and not a pass either.
    skipped = junit(tmp_path, '<testcase classname="a" name="t"><skipped message="spyre-eager-cb'
                    ' does not run on stack default"/></testcase>')
    verdict, _, _, why = judge(CASE, 0, skipped)
    assert verdict == "not run" and "skipped: spyre-eager-cb does not run on stack default" in why


def test_every_case_runs_on_a_mode_its_stack_has():
    """A case on a mode its stack lacks would be skipped on every host: never proven."""
    for c in cpu_cases():
        variant = all_variants()[c.target]
        problem = KINDS[variant.target].stack_feature_problem(variant, c.stack)
        assert problem is None, (c, problem)


def test_the_run_fails_when_a_family_goes_uncaught_but_not_for_an_absent_stack():
    caught = Outcome(CASE, "caught")
    absent = Outcome(Case("keep-dummy-on-join", "spyre-eager-cb", "s", "k", "block leak",
                          stack="legacy"), "not applicable")
    assert uncaught_families([caught, absent]) == []
    missed = Outcome(Case("forget-free", "vllm-cpu", "s", "k", "block leak"), "uncaught")
    assert uncaught_families([caught, missed]) == ["forget-free"]
    assert "| forget-free | vllm-cpu | uncaught |" in table([caught, missed])


def test_outcomes_are_a_readable_allure_suite_of_their_own_per_host(tmp_path):
    outcomes = [Outcome(CASE, "caught", "suites.x::t", "token mismatch", "token mismatch: ...",
                        12.0, "child output", 1000),
                Outcome(Case("forget-free", "vllm-cpu", "s", "k", "block leak"), "uncaught",
                        message="1 test(s) passed with the fault injected")]
    write_allure(outcomes, tmp_path, host="lab-a")
    write_allure(outcomes, tmp_path, host="lab-b")
    folder = load_results(tmp_path)
    assert folder.problems == []
    assert sorted(t["status"] for t in folder.tests) == ["failed", "failed", "passed", "passed"]
    assert {labels_of(t)["suite"][0] for t in folder.tests} == {"selftest"}
    assert len({t["historyId"] for t in folder.tests}) == 4  # two hosts never collide
    failed = next(t for t in folder.tests if t["status"] == "failed")
    assert "expected a 'block leak' failure" in failed["statusDetails"]["message"]


def test_a_fault_given_a_variant_is_installed_only_in_that_variants_engines(monkeypatch, capsys):
    from harness.in_engine import faults

    calls = []
    monkeypatch.setitem(faults.FAULTS, "probe-fault", lambda config, **kw: calls.append(kw))
    monkeypatch.delenv("HIL_FAULTS", raising=False)
    cb = {"target": "spyre", "backend": "eager", "mode": "cb"}
    faults.apply_faults(["probe-fault:when=step,variant=vllm-cpu"], cb)
    assert calls == [] and "not installed (for vllm-cpu)" in capsys.readouterr().out
    faults.apply_faults(["probe-fault:when=step,variant=spyre-eager-cb"], cb)
    faults.apply_faults(["probe-fault:variant=vllm-cpu"], {"target": "vllm-cpu"})
    assert calls == [{"when": "step"}, {}]
