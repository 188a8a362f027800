"""pytest hooks of the vllm-hil plugin, each delegating to the module of its feature:
options (options.py), markers and parametrization (selection.py), what engines run with
(engine_setup.py), test order, shards and quarantine (ordering.py), output folders and timing
(outputs.py), the terminal summary (summary.py). Fixtures are in fixtures.py, the Allure
report's hooks in allure_report.py."""

from __future__ import annotations

import pytest

from harness.plugin import engine_setup, ordering, outputs, selection, summary
from harness.plugin.options import HOOKS, add_options


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser, HOOKS)


def pytest_configure(config: pytest.Config) -> None:
    # In this order: each refusal names the first bad argument, and nothing is cleaned
    # before every argument is accepted.
    selection.register_markers(config)
    selection.check_targets(config)
    selection.check_models(config)
    engine_setup.check_faults(config)
    engine_setup.export_engine_env(config)
    engine_setup.check_stack(config)
    ordering.load_shard_and_quarantine(config)
    engine_setup.check_inventory(config)
    outputs.clean_previous_outputs(config)


def pytest_sessionstart(session: pytest.Session) -> None:
    outputs.mark_time("session_start")


def pytest_collection_finish(session: pytest.Session) -> None:
    outputs.mark_time("collection_done")


def pytest_sessionfinish(session: pytest.Session) -> None:
    outputs.write_timing(session.config)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    selection.parametrize(metafunc)


# Last, so that the shards are planned over what -m and -k left.
@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ordering.order_items(config, items)
    ordering.keep_shard(config, items)
    ordering.quarantine(config, items)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    summary.write_summary(terminalreporter, config)
