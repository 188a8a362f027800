"""What kind of pytest invocation this is: one that runs tests, or one that only
shows something (``--help``, ``--collect-only``, ``--fixtures``...) and must write
nothing, in particular not clean the folders of a run in progress; and whether this
process is an xdist worker."""

from __future__ import annotations

import pytest

# pytest's own dests of the options that show something and run no test.
SHOW_ONLY = ("help", "version", "collectonly", "showfixtures", "show_fixtures_per_test",
             "markers", "setupplan")


def writes_nothing(config: pytest.Config) -> bool:
    return any(getattr(config.option, name, False) for name in SHOW_ONLY)


def is_worker(config: pytest.Config) -> bool:
    """Whether this process is an xdist worker (the controller alone reports and cleans)."""
    return hasattr(config, "workerinput")
