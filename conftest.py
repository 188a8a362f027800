"""Loads the vllm-hil pytest plugin for every suite and test in this repository, and so asks for
it: a conftest that loads the plugin's modules itself turns the harness on (an installed copy
loaded by its entry points stays inert unless asked, harness/plugin/activation.py).

Where the harness is also installed with its pytest11 entry points, pytest may have loaded the
plugin modules already (this repository's pyproject blocks them; another ini may not): register
only what is not loaded, so nothing registers twice.

A run of this repository's tests starts many child pytest runs (and xdist workers): they share
the fork-server parents (one per interpreter and environment, harness.engine.forkserver), which
the outermost process owns and stops at its end.
"""

import sys

import pytest

_PLUGINS = ["harness.plugin.hooks", "harness.plugin.fixtures", "harness.plugin.allure_report"]

pytest_plugins = [m for m in _PLUGINS if m not in sys.modules]


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    from harness.engine.forkserver import open_share

    if not hasattr(config, "workerinput"):  # xdist workers inherit the controller's
        config.stash[_SHARE] = open_share()


def pytest_unconfigure(config: pytest.Config) -> None:
    from harness.engine.forkserver import close_share

    folder = config.stash.get(_SHARE, None)
    if folder:
        done = close_share(folder)
        if not done.startswith("shared fork parents: 0 started"):
            print(f"\n{done}", file=sys.stderr)


_SHARE = pytest.StashKey["str | None"]()
