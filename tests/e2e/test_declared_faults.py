"""A fault proof proves something or the run fails: a fault whose ``variant=`` names no variant
is refused before any engine starts, one that matches no engine the run starts fails the run
though every test passed, and a failure the run's faults caused names them in its text.
(The refusals themselves, without engines: tests/unit/plugin/test_bad_arguments.py.)"""

import pytest

from tests.suite_runner import run_suite

pytestmark = pytest.mark.e2e  # the runs below start engines (but the refused one)

SELECTION = ("suites/test_token_equality.py", "-k", "single and not one-token",
             "--model", "tiny-llama", "--target", "vllm-cpu")


def test_a_typo_in_the_variant_of_a_fault_fails_the_run_instead_of_passing(tmp_path):
    run = run_suite(tmp_path, *SELECTION, "--inject-fault", "forget-free:variant=vllm_cpu")
    assert run.returncode == 4, run.output[-3000:]
    assert ("variant='vllm_cpu' is no target variant, so the fault would be installed nowhere;"
            " known: vllm-cpu, ") in run.output
    assert not run.outcomes  # refused before any test ran


def test_a_fault_installed_in_no_engine_fails_the_run_though_every_test_passed(tmp_path):
    run = run_suite(tmp_path, *SELECTION, "--inject-fault", "forget-free:variant=spyre-eager-cb")
    assert run.outcomes and set(run.outcomes.values()) == {"passed"}, run.outcomes
    assert run.returncode == 1, run.output[-3000:]
    assert ("fault(s) asked for and installed in no engine of this run:"
            " forget-free:variant=spyre-eager-cb") in run.output, run.output[-3000:]


def test_a_failure_names_the_faults_of_its_run(tmp_path):
    run = run_suite(tmp_path, *SELECTION, "--inject-fault", "perturb-logit:position=5")
    assert run.returncode == 1, run.output[-3000:]
    (failed,) = run.failed()
    assert "faults injected in this run: perturb-logit:position=5" in run.messages[failed]
    assert "installed in no engine" not in run.output
