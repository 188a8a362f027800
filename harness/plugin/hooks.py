"""pytest hooks of the vllm-hil plugin, each delegating to the module of its feature:
options (options.py), markers and parametrization (selection.py), what engines run with
(engine_setup.py), test order, shards and quarantine (ordering.py), output folders and timing
(outputs.py), the terminal summary (summary.py). Fixtures are in fixtures.py, the Allure
report's hooks in allure_report.py.

Every hook acts only in a session that asks for the harness (activation.py); in any other the
plugin registers only its harness-specific options (giving one asks for it) and is inert."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.plugin import (
    allure_report,
    engine_setup,
    faults_declared,
    geometries,
    ordering,
    outputs,
    reports_hold,
    selection,
    stack_variants,
    summary,
)
from harness.plugin.activation import active_because, is_active, register_fixtures
from harness.plugin.invocation import is_worker
from harness.plugin.options import HOOKS, add_options, check_settings, option_value


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    # Called as the plugin registers: the session's pytest arguments are parsed, its decision
    # can be made (a conftest loading the plugin registers it under its module's name).
    config = pluginmanager.get_plugin("pytestconfig")
    add_options(parser, HOOKS, generic=config is None or is_active(config))


def pytest_configure(config: pytest.Config) -> None:
    if not is_active(config):
        return
    register_fixtures(config)
    # In this order: each refusal names the first bad argument, and nothing is cleaned
    # before every argument is accepted. The settings first: every value typed and in range.
    check_settings(config)
    selection.register_markers(config)
    selection.check_targets(config)
    selection.check_models(config)
    geometries.check_geometries(config, selection.model_values(config))
    engine_setup.check_faults(config)
    engine_setup.export_engine_env(config)
    engine_setup.check_stack(config)
    ordering.load_shard_and_quarantine(config)
    engine_setup.check_inventory(config)
    # Last: a run refused above has not touched its reports folder; one that goes ahead
    # holds it until its session ends (a second run into it is refused here).
    reports_hold.hold_reports(config)
    outputs.end_on_sigterm(config)


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    why = active_because(config)
    if not why:
        return None
    faults = faults_declared.faults_header(config)  # a fault no report names reads as a bug
    return [f"vllm-hil: active ({why})", *([faults] if faults else [])]


def pytest_sessionstart(session: pytest.Session) -> None:
    if is_active(session.config):
        outputs.mark_time("session_start")


def pytest_collection_finish(session: pytest.Session) -> None:
    if is_active(session.config):
        outputs.mark_time("collection_done")


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> None:
    # Without xdist: the collection was accepted; a run with tests begins (see outputs.py).
    config = session.config
    if is_active(config) and session.items and config.pluginmanager.getplugin("dsession") is None:
        begin_run(config)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: object, ids: list[str]) -> None:
    # The xdist controller: a worker accepted its collection and has tests (every worker
    # collects the same; one that refused its collection reports none); none runs before.
    config = getattr(node, "config", None)
    if ids and config is not None and is_active(config):
        begin_run(config)


def begin_run(config: pytest.Config) -> None:
    """Before the first test, once: the earlier run's outputs go, this run's environment is
    written (a run refused before has touched neither)."""
    if not outputs.run_begun(config):
        outputs.begin_run(config)
        allure_report.write_run_environment(config)


def pytest_sessionfinish(session: pytest.Session) -> None:
    if is_active(session.config):
        outputs.write_timing(session.config)
        if not is_worker(session.config):  # the workers' engines have all started by now
            faults_declared.fail_uninstalled_faults(
                session, Path(option_value(session.config, "--hil-reports-dir")))
        ordering.usage_exit_of_refused_workers(session)
        stack_variants.usage_exit_of_empty_stack(session)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if is_active(metafunc.config):
        selection.parametrize(metafunc)
        geometries.parametrize(metafunc)


# Last, so that the shards are planned over what -m and -k left.
@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                   items: list[pytest.Item]) -> None:
    if not is_active(config):
        return
    geometries.keep_selected(config, items)  # the tests in the selected geometries
    for item in items:
        geometries.record(item)
    # What -m and -k left, without the tests of a suite the stack lacks; none left is refused.
    stack_variants.drop_emptied(config, items)
    stack_variants.refuse_empty_stack(session, config, items)
    ordering.order_items(config, items)
    ordering.keep_shard(config, items)
    ordering.quarantine(config, items)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    if is_active(config):
        summary.write_summary(terminalreporter, config)
