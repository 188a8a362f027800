"""pytest hooks for the Allure report: labels, parameters, request steps, evidence
attachments, and the run's report configuration.

Active only when allure-pytest writes results (``--alluredir``) in a session that asks for
the harness (activation.py). Suites know
nothing of it: labels come from the test's module, function and callspec;
evidence comes from a listener added to the session while the test's call phase
runs. A test that failed on a verdict gets a ``check`` label with the check's
name, which the summary files it by. Every test whose traces were judged carries the
``thresholds`` it used (precision, source, the three policies); with its evidence, a
calibrated one also the ``calibration`` figure (the measured noise, band and limit, and the
run's own values).
Under xdist every worker labels and attaches its own tests; the controller
alone writes categories.json, environment.properties and executor.json, and
alone cleans the results folder for ``--clean-alluredir``.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import pytest

try:  # without allure-pytest (a card host may lack it) this plugin loads and does nothing
    import allure
    from allure_commons import plugin_manager
    from allure_commons.types import AttachmentType
    from allure_commons.utils import uuid4
except ImportError:
    allure = None

from harness.checks.distribution import compare_distributions
from harness.checks.logprobs import compare_logprobs
from harness.core.serialise import snapshot_to_dict
from harness.core.verdict import VerdictFailed
from harness.plugin import geometries
from harness.plugin.activation import is_active
from harness.plugin.faults_declared import run_faults
from harness.plugin.invocation import is_worker
from harness.plugin.options import ALLURE, add_options, option_value
from harness.plugin.ordering import shard_with_plan
from harness.plugin.outputs import run_begun
from harness.report import attachments as att
from harness.report import triage_report
from harness.report.calibration_report import calibration_svg, record_key, record_of, rules_text
from harness.report.deviation_plot import deviation_svg, series_of_forced, series_of_free_run
from harness.report.evidence import CallEvidence, StepInfo, run_steps_of
from harness.report.labels import (
    ReportParam,
    device_instance,
    humanize,
    scenario_params,
    static_labels,
    static_params,
)
from harness.report.root_cause import labels_for
from harness.report.run_config import RunOptions, write_run_config
from harness.report.triage_report import (
    ATTACHMENT,
    JSON_ATTACHMENT,
    description_with_triage,
)
from harness.targets import kind_of_label, logprob_policy

log = logging.getLogger("harness.report")

EVIDENCE_KEY = pytest.StashKey[CallEvidence]()


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser, ALLURE)  # --allure-attach-passed (declared in options.py)


def _active(config: pytest.Config) -> bool:
    return (allure is not None and is_active(config)
            and bool(getattr(config.option, "allure_report_dir", None)))


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    # allure-pytest's --clean-alluredir empties the folder in every process; under
    # xdist a worker would delete what another already wrote. Only the controller,
    # which configures before any worker starts, may clean.
    if is_active(config) and is_worker(config) and getattr(config.option, "clean_alluredir", False):
        config.option.clean_alluredir = False


def write_run_environment(config: pytest.Config) -> None:
    """The run's environment, written as it begins (``harness.plugin.hooks``), so that a run
    killed before its end (a CI timeout) still leaves a report with it; rewritten at the end."""
    _write_config(config)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _write_config(session.config)


def _write_config(config: pytest.Config) -> None:
    if not _active(config) or is_worker(config) or not run_begun(config):
        return
    try:
        run = RunOptions(
            targets=str(option_value(config, "--target", "") or "all"),
            models=str(option_value(config, "--model", "")),
            faults=", ".join(run_faults(config)) or "none",
            markers=str(config.getoption("-m", "") or ""),
            workers=str(getattr(config.option, "numprocesses", None) or "0"),
            inventory=str(option_value(config, "--inventory", "") or ""),
            args=" ".join(config.invocation_params.args),
            stack=str(option_value(config, "--stack", "default") or "default"),
            shard=shard_with_plan(config),
            geometries="; ".join(g.describe() for g in geometries.selected(config)),
        )
        write_run_config(Path(config.option.allure_report_dir), run)
    except Exception as e:  # noqa: BLE001 - the run's verdict must not depend on its report
        sys.stderr.write(f"vllm-hil: could not write the Allure report configuration: {e!r}\n")


# ------------------------------------------------------------------ per test


def _params_of(item: pytest.Item) -> dict[str, Any]:
    callspec = getattr(item, "callspec", None)
    return dict(callspec.params) if callspec is not None else {}


def _add_param(p: ReportParam) -> None:
    allure.dynamic.parameter(p.name, p.value, excluded=p.excluded)


def _label_test(item: pytest.Item) -> None:
    params = _params_of(item)
    module = getattr(getattr(item, "module", None), "__name__", item.nodeid.split("::")[0])
    function = getattr(getattr(item, "function", None), "__name__", item.name.split("[")[0])
    stack = str(option_value(item.config, "--stack", "default") or "default")
    for name, value in static_labels(module, function, params):
        if name == "suite" and stack != "default":
            value = f"{value} @ {stack}"  # the same test on two stacks, side by side
        allure.dynamic.label(name, value)
    # Part of the history id: a test keeps one history per stack.
    allure.dynamic.parameter("stack", stack)
    # Not shown by Allure; lets the summary name a test so it can be rerun.
    allure.dynamic.label("nodeid", item.nodeid)
    for p in static_params(params):
        _add_param(p)
    callspec = getattr(item, "callspec", None)
    title = humanize(function) + (f" [{callspec.id}]" if callspec is not None else "")
    allure.dynamic.title(title)


def _device_of(item: pytest.Item, evidence: CallEvidence | None) -> str:
    recorded = dict(getattr(item, "user_properties", []) or []).get("device")
    if recorded:
        return str(recorded)
    variant = _params_of(item).get("target_variant")
    if evidence is None:
        return device_instance(variant)
    _, config = evidence.first_scenario()
    if config is None and evidence.configs:
        config = evidence.configs[0]
    if getattr(config, "device", None):
        return str(config.device)
    return device_instance(variant, evidence.first_trace_info(), config)


def _add_engine_params(evidence: CallEvidence) -> None:
    """What each engine of the test configured itself with, as its kind reports it (a card
    engine's registry entry), once per name."""
    seen: dict[str, str] = {}
    for run in evidence.runs:
        if run.trace is not None:
            for name, value in kind_of_label(run.trace.target).report_parameters(
                    dict(run.trace.info or {})).items():
                seen.setdefault(name, value)
    for name, value in seen.items():
        allure.dynamic.parameter(name, value)


def _emit_step(step: StepInfo) -> None:
    uuid = uuid4()
    plugin_manager.hook.start_step(uuid=uuid, title=step.title, params=step.params)
    for child in step.children:
        _emit_step(child)
    exc: BaseException | None = None
    if step.failure:
        exc = AssertionError(step.failure)
    elif step.broken:
        exc = RuntimeError("no answer from the engine")
    plugin_manager.hook.stop_step(
        uuid=uuid, exc_type=type(exc) if exc else None, exc_val=exc, exc_tb=None
    )


def deviation_plot_of(run: Any, title: str) -> str:
    """The deviation-by-position SVG of a compared run: the teacher-forced run's where there is
    one (every position), else the free run's compared positions."""
    diverged = {d.request_id: d.position for d in getattr(run.comparison, "diffs", [])
                if d.position is not None}
    if run.forced is not None:
        return deviation_svg(series_of_forced(run.forced, diverged), title, run.forced.logprob.tol)
    rules = getattr(run, "rules", None)
    policy = rules.logprob if rules is not None else logprob_policy(run.trace.target)
    free = compare_logprobs(run.reference, run.trace, policy)
    return deviation_svg(series_of_free_run(free, diverged), title, policy.tol)


def _attach_text(body: str, name: str, kind: Any) -> None:
    if body:
        allure.attach(body, name=name, attachment_type=kind)


def _used_calibrations(hil: Any) -> list[dict[str, Any]]:
    """The calibration records the session used (``PrecisionDesk.used``), with distributions."""
    used = getattr(getattr(hil, "precision", None), "used", None)
    return list(used.values()) if isinstance(used, dict) else []


def _judged_runs(evidence: CallEvidence) -> list[tuple[str, Any, list[Any]]]:
    """(target label, rules, runs judged by them) once per distinct label and rules."""
    out: list[tuple[str, Any, list[Any]]] = []
    for run in evidence.runs:
        if run.rules is None:
            continue
        label = str(getattr(run.trace, "target", None) or getattr(run.config, "label", "?"))
        same = next((e for e in out if e[0] == label and e[1] == run.rules), None)
        if same is None:
            out.append((label, run.rules, [run]))
        else:
            same[2].append(run)
    return out


def _attach_thresholds(evidence: CallEvidence, hil: Any) -> None:
    """The ``thresholds`` a test's traces were judged by, once per test."""
    used = _used_calibrations(hil)
    blocks = [rules_text(label, rules, record_of(rules.calibration, used)
                         if rules.calibration is not None else None)
              for label, rules, _ in _judged_runs(evidence)]
    _attach_text("\n\n".join(blocks), "thresholds", AttachmentType.TEXT)


def run_values(runs: list[Any], rules: Any) -> dict[str, list[float]]:
    """The runs' own values of the calibration's metrics where the check computes them: the
    logprob deviation and the top-k KL of every compared position of the free run."""
    values: dict[str, list[float]] = {"chosen_logprob": [], "kl_topk": []}
    for run in runs:
        if run.reference is None or run.trace is None:
            continue
        free = compare_logprobs(run.reference, run.trace, rules.logprob)
        values["chosen_logprob"] += [d.value for r in free.requests for d in r.deviations]
        kl = compare_distributions(run.reference, run.trace, rules.distribution)
        values["kl_topk"] += kl.positions()
    return {k: v for k, v in values.items() if v}


def _attach_calibrations(evidence: CallEvidence, hil: Any) -> None:
    """The ``calibration`` figure of each calibration the test's traces were judged by."""
    used = _used_calibrations(hil)
    done: list[tuple[str, str]] = []
    for _, rules, runs in _judged_runs(evidence):
        if rules.calibration is None:
            continue
        record = record_of(rules.calibration, used)
        if record is None or record_key(record) in done:
            continue
        done.append(record_key(record))
        try:
            values = run_values(runs, rules)
        except Exception:  # noqa: BLE001 - the figure without the run's values is still useful
            log.exception("allure report: the run's values for the calibration figure")
            values = {}
        suffix = f" {len(done)}" if len(done) > 1 else ""
        _attach_text(calibration_svg(record, values), "calibration" + suffix, AttachmentType.SVG)


def _attach_evidence(evidence: CallEvidence, excinfo: pytest.ExceptionInfo[BaseException] | None,
                     hil: Any = None) -> None:
    _attach_calibrations(evidence, hil)
    many = len([r for r in evidence.runs if r.scenario is not None]) > 1
    for i, run in enumerate(evidence.runs):
        suffix = f" ({i + 1}: {getattr(run.scenario, 'name', '')})" if many else ""
        title = f"{getattr(run.scenario, 'name', '?')} on {getattr(run.config, 'label', '?')}"
        if run.comparison is not None and run.reference is not None and run.trace is not None:
            prompts = run.scenario.prompts_by_id() if run.scenario is not None else None
            page = att.token_diff_html(run.comparison, run.reference, run.trace, title,
                                       decode=run.decode, prompts=prompts)
            _attach_text(page, "token diff" + suffix, AttachmentType.HTML)
        if run.reference is not None and run.trace is not None:
            _attach_text(deviation_plot_of(run, title), "deviation plot" + suffix,
                         AttachmentType.SVG)
        steps = att.ledger_steps(run.trace) if run.trace is not None else []
        if any(d.kv for d in steps):
            _attach_text(att.ledger_csv(steps), "KV ledger" + suffix, AttachmentType.CSV)
            png = att.ledger_plot_png(steps, title, run.ledger)
            if png:
                allure.attach(png, name="KV ledger plot" + suffix, attachment_type=AttachmentType.PNG)
        if run.scenario is not None:
            _attach_text(att.scenario_json(run.scenario, run.config), "scenario" + suffix,
                         AttachmentType.JSON)
    for config, snaps in evidence.snapshots:
        body = json.dumps({"engine": getattr(config, "label", None),
                           "snapshots": [snapshot_to_dict(s) for s in snaps]}, indent=1)
        _attach_text(body, "KV snapshot", AttachmentType.JSON)
    logs = [att.log_excerpt(path, offset) for path, offset in evidence.logs.items()]
    tail = getattr(excinfo.value, "log_tail", "") if excinfo is not None else ""
    if tail and not any(logs):
        logs.append(str(tail))
    for i, text in enumerate(t for t in logs if t):
        _attach_text(text, "engine log" + (f" {i + 1}" if i else ""), AttachmentType.TEXT)


def _label_root_cause(item: pytest.Item) -> None:
    """A test that found its engine dirty names the test that left it so (the summary groups
    failures by it) and carries what was found and done."""
    hil = getattr(item, "funcargs", {}).get("hil")
    if hil is None:
        return
    events = hil.hygiene.affecting(item.nodeid)
    for name, value in labels_for(events):
        allure.dynamic.label(name, value)
    if events:
        _attach_text("\n".join(e.describe() for e in events), "engine hygiene",
                     AttachmentType.TEXT)


def _label_triage(item: pytest.Item, evidence: CallEvidence | None) -> None:
    """A failure that was triaged (harness.triage) carries the verdict's key as the ``triage``
    label and a ``triage: KEY`` tag (a filter in the Allure UI), the verdict in the test's
    description, and the runs as a table attachment."""
    results = list(evidence.triage) if evidence is not None else []
    if not results:
        return
    for result in results:
        for name, value in triage_report.labels_for(result):
            allure.dynamic.label(name, value)
    function = getattr(item, "function", None)
    allure.dynamic.description(description_with_triage(getattr(function, "__doc__", None),
                                                       results))
    for i, result in enumerate(results):
        suffix = f" {i + 1}" if i else ""
        _attach_text(result.table(), ATTACHMENT + suffix, AttachmentType.TEXT)
        _attach_text(json.dumps(result.to_dict(), indent=1), JSON_ATTACHMENT + suffix,
                     AttachmentType.JSON)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):  # type: ignore[no-untyped-def]
    hil = getattr(item, "funcargs", {}).get("hil") if _active(item.config) else None
    evidence = CallEvidence()
    if hil is not None:
        item.stash[EVIDENCE_KEY] = evidence
        hil.add_listener(evidence)
    try:
        yield
    finally:
        if hil is not None:
            hil.remove_listener(evidence)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    if not _active(item.config):
        return
    report: pytest.TestReport = outcome.get_result()
    try:
        if report.when == "setup":
            _label_test(item)
            emulated = dict(getattr(item, "user_properties", []) or []).get("emulated")
            if emulated:  # passed on an emulated runtime: never a card's verdict
                allure.dynamic.tag("emulated")
                allure.dynamic.parameter("emulated", str(emulated))
            if report.skipped or report.failed:
                allure.dynamic.parameter("device", _device_of(item, None), excluded=True)
        elif report.when == "call":
            failed = call.excinfo.value if call.excinfo is not None else None
            if isinstance(failed, VerdictFailed):
                allure.dynamic.label("check", failed.verdict.check)
            _label_root_cause(item)
            evidence = item.stash.get(EVIDENCE_KEY, None)
            _label_triage(item, evidence)
            allure.dynamic.parameter("device", _device_of(item, evidence), excluded=True)
            if evidence is None or evidence.empty:
                tail = getattr(call.excinfo.value, "log_tail", "") if call.excinfo else ""
                if report.failed and tail:
                    _attach_text(str(tail), "engine log", AttachmentType.TEXT)
                return
            scenario, config = evidence.first_scenario()
            if scenario is not None:
                for p in scenario_params(scenario, config):
                    _add_param(p)
            _add_engine_params(evidence)
            for run in evidence.runs:
                if run.scenario is not None:
                    _emit_step(run_steps_of(run))
            hil = getattr(item, "funcargs", {}).get("hil")
            _attach_thresholds(evidence, hil)
            if report.failed or option_value(item.config, "--allure-attach-passed"):
                _attach_evidence(evidence, call.excinfo, hil)
    except Exception:  # noqa: BLE001 - a report problem must never change a test's outcome
        log.exception("allure report: labelling or attaching %s failed", item.nodeid)
