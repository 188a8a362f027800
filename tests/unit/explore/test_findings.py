"""What hil explore writes: findings.md (geometry, workload, the failed check's text, the exact
command of the regression test, the search's figures; "no finding" when there is none) and a
regression test that is valid Python replaying the finding's example on its target."""

from __future__ import annotations

import ast
import shlex
from collections import Counter
from pathlib import Path

from harness.core.verdict import Verdict
from harness.explore.example import Example, RequestShape, example_from_dict
from harness.explore.findings import (
    FINDINGS_FILE,
    RunInfo,
    regression_command,
    write_findings,
)
from harness.explore.runner import FAILED, Outcome
from harness.explore.search import Finding, Identity, SearchResult, Tally

EXAMPLE = Example.of({"max_model_len": 128, "max_num_seqs": 2, "chunk_size": 64,
                      "num_blocks": 3, "prefix_caching": True},
                     (RequestShape(64, 2, family=1, shared=64), RequestShape(1, 1, arrival=2)))
ID = Identity("spyre-eager-cp", "tiny-llama", "default", ("forget-free",))
FAILED_CHECK = Verdict.failed(
    "kv_ledger.conservation", "kv invariant conservation broken at step 0: 1 of 3 blocks are"
    " neither free, owned nor pad: [1]", at=0, details="kv invariant conservation broken at"
    " step 0: 1 of 3 blocks are neither free, owned nor pad: [1]\n    step  run\n>>  0     1")


def finding(example: Example = EXAMPLE) -> Finding:
    outcome = Outcome(FAILED, verdicts=[FAILED_CHECK, Verdict.passed("token_equality")])
    return Finding(check=FAILED_CHECK.check, example=example, outcome=outcome, identity=ID,
                   found_after=41.5, examples_before=9, shrink_seconds=12.0, shrink_runs=7,
                   original=example)


def info(tmp_path: Path, checkout: Path | None = None) -> RunInfo:
    extra = {} if checkout is None else {"checkout": checkout}
    return RunInfo(seed=3, budget=120, shrink_budget=60, model="tiny-llama", stack="default",
                   faults=ID.faults, cache_dir=tmp_path / "cache",
                   explore_dir=tmp_path / "reports" / "explore", python="/venv/bin/python",
                   **extra)


def result(findings: list[Finding]) -> SearchResult:
    tally = Tally(examples=9, passed=8, failed=1, geometries=2, run_seconds=27.0,
                  geometries_refused=Counter({"the engine refused it at start: too small": 1}),
                  known=Counter({"a known leak": 2}))
    return SearchResult(findings, tally, 53.0, "a finding" if findings else "the budget was spent",
                        engine_starts=3)


def test_a_finding_is_written_with_its_geometry_workload_check_and_command(tmp_path):
    (test,) = write_findings(info(tmp_path), [("spyre-eager-cp", result([finding()]))])
    text = (tmp_path / "reports" / "explore" / FINDINGS_FILE).read_text()
    assert text.startswith("# hil explore: 1 finding\n")
    assert f"## Finding {EXAMPLE.key}: [check kv_ledger.conservation]" in text
    assert "Geometry: context 128, batch 2, chunk 64, pool 3 blocks, prefix caching on" in text
    assert "num_blocks = 3\nprefix_caching = true" in text
    assert "| r0 | 64 | 64 (family 1) | 2 | 0 | - |" in text
    assert "| r1 | 1 | - | 1 | 2 | - |" in text
    assert "[check kv_ledger.conservation] kv invariant conservation broken at step 0" in text
    assert ">>  0     1" in text  # the step table, as the check rendered it
    assert "Found after 41.5 s of search (9 examples run); shrunk in 12.0 s (7 runs)" in text
    assert "one example costs 3.0 s on average" in text
    assert "known failures met (not findings): a known leak: 2 example(s)" in text
    assert "geometry refused (1x): the engine refused it at start: too small" in text
    assert test.name == f"test_finding_{EXAMPLE.key}.py" and test.parent.name == "explore"
    command = text.split("```bash\n", 1)[1].split("\n```", 1)[0]
    assert command in test.read_text()
    words = shlex.split(command.split(" && ", 1)[1])
    assert words[:3] == ["/venv/bin/python", "-m", "pytest"]
    assert str(test.resolve()) in words and "-p" in words and "harness.plugin.hooks" in words
    for option, value in (("--target", "spyre-eager-cp"), ("--model", "tiny-llama"),
                          ("--stack", "default"), ("--inject-fault", "forget-free"),
                          ("--hil-cache-dir", str((tmp_path / "cache").resolve()))):
        assert words[words.index(option) + 1] == value


def test_the_regression_test_is_python_that_replays_the_example_on_its_target(tmp_path):
    (test,) = write_findings(info(tmp_path), [("spyre-eager-cp", result([finding()]))])
    source = test.read_text()
    tree = ast.parse(source)
    (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert fn.name == f"test_finding_{EXAMPLE.key}"
    assert [a.arg for a in fn.args.args] == ["hil", "model", "target_variant"]
    assert "@pytest.mark.hil_targets('spyre-eager-cp')" in source
    namespace: dict = {}
    exec(compile(source, str(test), "exec"), namespace)  # noqa: S102 - our own output
    assert example_from_dict(namespace["EXAMPLE"]) == EXAMPLE
    assert namespace["RECORDED"] == {**ID.to_dict(), "check": "kv_ledger.conservation"}


def test_no_finding_writes_no_test_and_says_so(tmp_path):
    assert write_findings(info(tmp_path), [("vllm-cpu", result([]))]) == []
    text = (tmp_path / "reports" / "explore" / FINDINGS_FILE).read_text()
    assert text.startswith("# hil explore: no findings\n")
    assert "### vllm-cpu" in text and "stopped: the budget was spent" in text
    assert not list((tmp_path / "reports" / "explore").glob("test_*.py"))


def test_outside_a_checkout_the_command_asks_for_the_installed_plugin(tmp_path):
    command = regression_command(tmp_path / "t.py", finding(), info(tmp_path, tmp_path))
    words = shlex.split(command)
    assert words[:5] == ["/venv/bin/python", "-m", "pytest", "-p", "vllm_hil"]
    assert "&&" not in words


def test_a_check_text_with_quotes_and_backslashes_still_makes_a_valid_test(tmp_path):
    odd = Verdict.failed("token_equality", 'token mismatch at """ and \\n in the prompt')
    f = finding()
    f.outcome = Outcome(FAILED, verdicts=[odd])
    f.check = odd.check
    (test,) = write_findings(info(tmp_path), [("spyre-eager-cp", result([f]))])
    doc = ast.get_docstring(ast.parse(test.read_text()))
    assert "token mismatch at ''' and \\n in the prompt" in doc
