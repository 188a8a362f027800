"""The report's internals without engines: categories against the harness's real failure
messages, the token diff page, the KV ledger CSV and plot, the run configuration, the
results-folder edge cases, the summary, and `hil report` without its tool."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest

from harness.checks.capacity import (
    CapacityError,
    blocks_needed,
    check_pool_serves_full_batch,
    preflight,
)
from harness.checks.ledger import check_idle_ledgers, check_ledger
from harness.checks.preemption import check_full_batch, check_no_preemption
from harness.checks.tokens import compare_traces, token_verdict
from harness.core.comparison import NearTiePolicy
from harness.core.config import ConfigError, EngineConfig
from harness.core.devices import DeviceScan
from harness.core.errors import EngineCrashed, EngineStartError, EngineTimeout
from harness.core.trace import (
    SOURCE_VLLM_SCHEDULER,
    KvSnapshot,
    RequestTrace,
    StepRecord,
    TokenStep,
    Trace,
)
from harness.core.verdict import Verdict, VerdictFailed
from harness.report import generate
from harness.report.attachments import ledger_csv, ledger_plot_png, log_excerpt, token_diff_html
from harness.report.categories import (
    CATEGORIES,
    UNCLASSIFIED_FAILURE,
    categories_json,
    classify,
)
from harness.report.evidence import CallEvidence, ScenarioRun, run_steps_of
from harness.report.labels import device_instance, static_labels, suite_name
from harness.report.results import load_results
from harness.report.run_config import (
    RunOptions,
    environment_properties,
    executor_from_env,
    format_properties,
    write_run_config,
)
from harness.report.summary import summarize, summary_markdown
from harness.scenario.prompts import EngineLimits, RequestSpec, Scenario
from harness.targets.variants import VARIANTS
from tests.allure_results import allure_result, results_folder
from tests.unit.checks.test_admission import joining


def exconly(exc: BaseException) -> str:
    """The message allure-pytest records for an exception (pytest's exconly)."""
    try:
        raise exc
    except BaseException:
        return pytest.ExceptionInfo.from_current().exconly()


def step(token: int, lp: float, alts: dict[int, float] | None = None) -> TokenStep:
    top = {token: lp, **(alts or {})}
    return TokenStep(token_id=token, logprob=lp, top_logprobs=top)


def trace_of(target: str, tokens: list[int], diverge_at: int | None = None) -> Trace:
    steps = []
    for i, t in enumerate(tokens):
        steps.append(step(t, -0.1 - i / 100, {t + 1000: -3.0}))
    req = RequestTrace(request_id="r0", prompt_token_ids=[5, 6, 7], steps=steps,
                       finish_reason="length")
    return Trace(target=target, requests={"r0": req})


def decode(ids: list[int]) -> str:
    return f"<{ids[0]}>"


PROMPTS = {"r0": "a prompt"}


def mismatch_comparison():
    ref = trace_of("cpu-ref", [11, 12, 13, 14, 15])
    dev = trace_of("vllm-cpu", [11, 12, 99, 14, 15])
    return ref, dev, compare_traces(ref, dev, NearTiePolicy())


def kv_step(n: int, free: list[int], owned: dict[str, list[int]], preempted=(), running=()):
    snap = KvSnapshot(source=SOURCE_VLLM_SCHEDULER, num_blocks=8, pad_blocks=[0],
                      free_blocks=free, owned=owned, counted_free=len(free),
                      ref_counts={b: 1 for bs in owned.values() for b in bs})
    return StepRecord(step=n, running=list(running), preempted=list(preempted), kv=[snap])


def leaky_steps() -> list[StepRecord]:
    return [
        kv_step(-1, [1, 2, 3, 4, 5, 6, 7], {}),
        kv_step(0, [3, 4, 5, 6, 7], {"r0": [1, 2]}, running=["r0"]),
        kv_step(1, [4, 5, 6, 7], {"r1": [3]}, preempted=["r0"], running=["r1"]),
        kv_step(2, [2, 3, 4, 5, 6, 7], {}),  # block 1 neither free nor owned
    ]


# ------------------------------------------------------------------ categories


def leaky_trace() -> Trace:
    steps = leaky_steps()
    return Trace(target="vllm-cpu", steps=steps[1:], initial=steps[0], idle_at_end=True)


def failed(verdict: Verdict) -> tuple[str, str]:
    """(message, check) as the report records a suite's failed expectation."""
    assert not verdict.ok
    return exconly(VerdictFailed(verdict)), verdict.check


def _real_messages() -> dict[str, tuple[str, str, str | None]]:
    """category -> (status, message, failing check), each made by the harness's own code."""
    ref, dev, cmp_ = mismatch_comparison()
    preempted = Trace(target="vllm-cpu", steps=leaky_steps()[:3],
                      metrics={"vllm:num_preemptions": 1.0})
    preempted.steps[0].executed = {"r0": 8}
    unread = Trace(target="vllm-cpu", steps=leaky_steps()[:3])
    need = blocks_needed(256, 2, 16)
    try:
        preflight(need, 3, "num_gpu_blocks_override")
    except CapacityError as e:
        capacity = exconly(e)
    tail = "INFO ... token mismatch: and recompute: in the log must not decide anything"
    missing = DeviceScan(kind="spyre", looked_for="PCI 1014:06a7").why_none()
    warmup = KvSnapshot(source=SOURCE_VLLM_SCHEDULER, num_blocks=4, pad_blocks=[0],
                        free_blocks=[2, 3], owned={"warmup-0": [1]})
    no_probe = Trace(target="vllm-cpu", steps=[StepRecord(0)])
    return {
        "token mismatch": ("failed", *failed(token_verdict(cmp_, decode, PROMPTS))),
        "recompute": ("failed", *failed(check_no_preemption(preempted))),
        "recompute (full batch)": ("failed", *failed(check_full_batch(leaky_trace(), 4))),
        "scheduling": ("failed", *failed(check_ledger(joining()))),
        "block leak": ("failed", *failed(check_ledger(leaky_trace()))),
        "block leak (warmup)": ("failed", *failed(check_idle_ledgers([warmup]))),
        "capacity": ("broken", capacity, None),
        "capacity (pool verdict)": ("failed", *failed(check_pool_serves_full_batch(need, 17))),
        "capacity (spyre)": ("broken", exconly(EngineStartError(
            "engine spyre-eager-cb failed to start with model /m: ValueError: Number of pages"
            " available on Spyre (4) is not enough to serve the current model", tail)), None),
        "device missing": ("failed", exconly(pytest.fail.Exception(
            f"device required but missing: {missing}")), None),
        "device missing (skip)": ("skipped", exconly(pytest.skip.Exception(missing)), None),
        "timeout": ("broken", exconly(EngineTimeout(
            "engine vllm-cpu gave no answer within 900 s; killed it", tail)), None),
        "timeout (pytest-timeout)": ("failed", exconly(pytest.fail.Exception("Timeout >1800.0s")),
                                     None),
        "engine crash / harness error": ("broken", exconly(EngineCrashed(
            "engine vllm-cpu died with exit code -9 during a call", tail)), None),
        "engine crash (config)": ("broken", exconly(ConfigError("unknown target 'x'")), None),
        "engine crash (other exception)": ("broken", exconly(KeyError("requests")), None),
        "engine crash (no ledger recorded)": ("failed", *failed(check_ledger(no_probe))),
        "engine crash (preemption signal missing)": ("failed",
                                                     *failed(check_no_preemption(unread))),
    }


@pytest.mark.parametrize("case", list(_real_messages()))
def test_each_real_failure_lands_in_its_category(case):
    status, message, check = _real_messages()[case]
    want = re.sub(r" \(.*\)$", "", case)
    if want.startswith("engine crash"):
        want = "engine crash / harness error"
    # Filed by the failing check where there is one; Allure's regex (the check tag) agrees.
    assert classify(status, message, check) == want, (check, message)
    assert classify(status, message) == want, message


def test_a_verdict_is_filed_by_its_check_not_by_its_words():
    words = exconly(VerdictFailed(Verdict.failed("token_equality", "recompute: kv invariant x")))
    assert classify("failed", words, "token_equality") == "token mismatch"
    assert classify("failed", words) == "token mismatch"
    suite_text = exconly(AssertionError("after warmup: [idle_all_free] token mismatch: recompute:"))
    assert classify("failed", suite_text) is None  # words a suite wrote decide nothing


def test_categories_are_exclusive_as_allure_applies_them():
    # Allure files a result under every category whose regex fully matches; each real
    # message must match exactly one entry (or two entries of the same name).
    entries = categories_json()
    for case, (status, message, _) in _real_messages().items():
        hits = {e["name"] for e in entries
                if status in e["matchedStatuses"] and re.fullmatch(e["messageRegex"], message)}
        assert len(hits) == 1, (case, hits)


def test_unknown_assertion_is_unclassified_and_passes_are_not_categorised():
    assert classify("failed", "AssertionError: assert 3 == 4") is None
    assert classify("passed", "") is None
    assert UNCLASSIFIED_FAILURE not in {c.name for c in CATEGORIES}


def test_log_tail_words_do_not_move_a_crash_into_another_category():
    message = exconly(EngineCrashed("engine x died with exit code 1 during a call",
                                    "KV cache too small: token mismatch: [check capacity] recompute:"))
    assert classify("broken", message) == "engine crash / harness error"


# ------------------------------------------------------------------ token diff page


class _Rows(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[str, list[str]]] = []
        self._cls: str | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self._cls = dict(attrs).get("class", "")
            self.rows.append((self._cls, []))

    def handle_data(self, data):
        if self.rows and data.strip():
            self.rows[-1][1].append(data.strip())


def test_token_diff_highlights_the_first_divergence_only():
    ref, dev, cmp_ = mismatch_comparison()
    page = token_diff_html(cmp_, ref, dev, "unit", decode=decode, prompts=PROMPTS)
    parser = _Rows()
    parser.feed(page)
    diverge = [cells for cls, cells in parser.rows if cls == "diverge"]
    assert len(diverge) == 1
    assert diverge[0][:3] == ["2", "13", "<13>"] and "99" in diverge[0] and "<99>" in diverge[0]
    assert "first divergence" in diverge[0]
    after = [cells for cls, cells in parser.rows if cls == "after"]
    assert [c[0] for c in after] == ["3", "4"] and all("not compared" in c for c in after)
    assert "mismatch" in page and "a prompt" in page and "-0.1200" in page
    assert "<script" not in page


def test_token_diff_elides_long_outputs_around_the_divergence():
    ref = trace_of("cpu-ref", list(range(200)))
    dev = trace_of("vllm-cpu", list(range(150)) + [999] + list(range(151, 200)))
    cmp_ = compare_traces(ref, dev)
    parser = _Rows()
    parser.feed(token_diff_html(cmp_, ref, dev))
    shown = [int(c[0]) for cls, c in parser.rows if c and c[0].isdigit() and cls != "picked"]
    assert 150 in shown and 0 in shown and 100 not in shown


# ------------------------------------------------------------------ KV ledger


def test_ledger_csv_has_a_row_per_step_and_source():
    text = ledger_csv(leaky_steps())
    lines = text.strip().splitlines()
    assert lines[0].startswith("step,source,num_blocks,pad_blocks,free_blocks,owned_blocks")
    assert len(lines) == 1 + 4
    assert lines[3].split(",")[:6] == ["1", SOURCE_VLLM_SCHEDULER, "8", "0", "4", "1"]
    assert lines[3].split(",")[11] == "r0"  # preempted column


def test_ledger_plot_is_a_png_and_absent_without_snapshots():
    steps = leaky_steps()
    png = ledger_plot_png(steps, "unit", check_ledger(leaky_trace()))
    assert png is not None and png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    assert ledger_plot_png([StepRecord(0)]) is None


def test_log_excerpt_marks_where_the_test_began(tmp_path):
    log = tmp_path / "engine.log"
    log.write_text("start\nwarmup\n")
    offset = log.stat().st_size
    with log.open("a") as f:
        f.write("[hil] fault perturb_logit fired\n")
    text = log_excerpt(log, offset)
    lines = text.splitlines()
    assert lines[-2].startswith("----- this test's engine calls start here")
    assert lines[-1] == "[hil] fault perturb_logit fired"
    assert log_excerpt(tmp_path / "absent.log") == ""


# ------------------------------------------------------------------ steps and labels


def test_each_request_is_a_step_with_its_verdict():
    ref, dev, cmp_ = mismatch_comparison()
    scenario = Scenario("unit", [RequestSpec("r0", (5, 6, 7), 5)], EngineLimits(64, 2))
    cfg = EngineConfig(target="vllm-cpu", model="/m", max_model_len=64, max_num_seqs=2)
    ev = CallEvidence()
    ev.on_scenario(cfg, scenario)
    ev.on_trace(cfg, scenario, dev)
    ev.on_comparison(scenario, ref, dev, cmp_, decode)
    verdict = token_verdict(cmp_, decode, PROMPTS)
    ev.on_verdict(verdict, dev)
    assert len(ev.runs) == 1 and ev.runs[0].comparison is cmp_ and ev.runs[0].decode is decode
    assert ev.runs[0].verdicts == [verdict] and ev.failed_verdict is verdict
    head = run_steps_of(ev.runs[0])
    assert head.title.startswith("run unit on vllm-cpu: 1 requests")
    (req,) = head.children
    assert "3 prompt tokens" in req.title and "mismatch at position 2" in req.title
    assert req.failure and req.failure.startswith("token mismatch:")
    assert req.params["verdict"] == "mismatch"
    no_answer = run_steps_of(ScenarioRun(config=cfg, scenario=scenario))
    assert no_answer.broken and "no answer" in no_answer.title


def test_labels_mirror_suite_test_and_scenario():
    v = VARIANTS["spyre-eager-cb"]
    labels = dict(static_labels("suites.test_block_freeing", "test_blocks_return_to_the_pool",
                                {"target_variant": v, "model": "tiny-llama", "name": "x-y"}))
    assert labels["epic"] == labels["parentSuite"] == "block freeing" == suite_name("test_block_freeing.py")
    assert labels["feature"] == "blocks return to the pool" and labels["story"] == "x-y"
    assert labels["suite"] == "spyre-eager-cb" and labels["subSuite"] == "tiny-llama"


def test_device_instance_precedence():
    v = VARIANTS["spyre-sendnn-cb"]
    assert device_instance(v, {"device_instance": "card-3"}, env={}) == "card-3"
    assert device_instance(v, {}, env={"HIL_DEVICE_INSTANCE": "aiu-7"}) == "aiu-7"
    assert device_instance(v, {}, env={}) == "unknown"
    assert device_instance(VARIANTS["vllm-cpu"], {}, env={}).startswith("cpu@")


# ------------------------------------------------------------------ run configuration


def test_environment_properties_list_stack_devices_and_drivers(tmp_path):
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "neuron0").write_text("")
    (tmp_path / "sys/module/neuron").mkdir(parents=True)
    (tmp_path / "sys/module/neuron/version").write_text("2.19.64.0\n")
    props = environment_properties(RunOptions(targets="vllm-cpu", models="tiny-llama",
                                              faults="forget-free"), root=tmp_path)
    for key in ("host", "torch", "vLLM", "vllm-spyre", "vllm-neuron", "transformers",
                "devices.cpu", "devices.spyre", "devices.neuron", "run.faults"):
        assert key in props, key
    assert props["vllm-neuron"] == "not installed"
    assert props["devices.neuron"] == "1 usable of 1 found"
    assert props["neuron.driver"] == "2.19.64.0"
    assert props["devices.spyre"] == "0 usable of 0 found"
    text = format_properties({"a key": "x=y\nz"})
    assert text == "a\\ key=x=y\\nz\n"


def test_executor_from_ci_variables_only():
    gh = executor_from_env({"GITHUB_ACTIONS": "true", "GITHUB_SERVER_URL": "https://gh.example",
                            "GITHUB_REPOSITORY": "lab/hil", "GITHUB_RUN_ID": "77",
                            "GITHUB_RUN_NUMBER": "12", "GITHUB_WORKFLOW": "nightly"})
    assert gh["buildOrder"] == 12 and gh["buildUrl"] == "https://gh.example/lab/hil/actions/runs/77"
    assert gh["buildName"] == "nightly #12" and gh["type"] == "github"
    assert executor_from_env({}) is None
    assert executor_from_env({"CI": "true", "HIL_BUILD_NAME": "n1"})["buildName"] == "n1"


def test_write_run_config_writes_the_three_files(tmp_path):
    written = write_run_config(tmp_path, RunOptions(), env={"CI": "true"}, root=tmp_path)
    assert sorted(p.name for p in written) == [
        "categories.json", "environment.properties", "executor.json"]
    cats = json.loads((tmp_path / "categories.json").read_text())
    assert [c["name"] for c in cats][:8] == [
        "device missing", "timeout", "capacity", "recompute", "inherited state", "scheduling",
        "block leak", "token mismatch"]
    assert not (write_run_config(tmp_path / "x", env={}, root=tmp_path)[-1].name == "executor.json")


# ------------------------------------------------------------------ results folder


def test_results_folder_keeps_good_results_and_names_bad_files(tmp_path):
    folder = load_results(results_folder(tmp_path))
    assert [r["name"] for r in folder.tests] == ["test_ok"]
    text = "\n".join(folder.problems)
    assert "u2-result.json: skipped: not valid JSON" in text and "truncated?" in text
    assert "u3-result.json: skipped: not an Allure test result (no uuid or name)" in text
    assert "notes.txt: skipped" in text


def test_empty_and_missing_results_folders_are_explained(tmp_path):
    (tmp_path / "empty").mkdir()
    assert "no test results" in load_results(tmp_path / "empty").problems[0]
    assert "no such results folder" in load_results(tmp_path / "nope").problems[0]


# ------------------------------------------------------------------ summary


def test_summary_counts_categories_and_lists_failing_tests():
    tests = [
        allure_result("a", "passed"),
        allure_result("b", "failed", "VerdictFailed: [check token_equality] token mismatch: request"
                      " 'r0' at position 5", check="token_equality"),
        allure_result("c", "failed", "VerdictFailed: [check kv_ledger.conservation] kv invariant"
                      " conservation broken at step 3", check="kv_ledger.conservation"),
        allure_result("d", "skipped", "Skipped: no Spyre device found: looked for PCI"),
        allure_result("e", "failed", "AssertionError: assert 1 == 2"),
    ]
    s = summarize(tests, ["x: skipped: not valid JSON"])
    md = summary_markdown(s)
    assert "**5 tests**: 1 passed, 3 failed, 1 skipped" in md
    assert "| token mismatch | 1 |" in md and "| block leak | 1 |" in md
    assert f"| {UNCLASSIFIED_FAILURE} | 1 |" in md
    assert "Skipped: 1 device missing." in md
    assert "| block leak | `suites/t.py::c` | vllm-cpu | tiny-llama |" in md
    assert md.index("`suites/t.py::c`") < md.index("`suites/t.py::b`")  # category order
    assert "## Results problems" in md


# ------------------------------------------------------------------ hil report


def test_missing_report_tool_still_writes_the_summary(tmp_path, monkeypatch):
    monkeypatch.setattr(generate, "TOOL_BIN", tmp_path / "no-allure")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("HIL_ALLURE", raising=False)
    summary = tmp_path / "summary.md"
    out = generate.generate_report(results_folder(tmp_path), tmp_path / "report", summary)
    assert not out.generated and out.tool_missing
    assert "Allure report tool is not installed" in out.error and "./setup.sh" in out.error
    assert "| token mismatch | 1 |" in summary.read_text()
    rc = generate.report_command(results_folder(tmp_path / "b"), tmp_path / "r", summary)
    assert rc == 2
