"""Whether a pytest session asks for the harness.

Installed, the plugin's entry points load into every pytest run of the environment; the harness
acts only in a session that asks for it, and in any other it adds its harness-specific options
to ``--help`` (giving one asks for it) and does nothing else (no parametrization, fixtures,
markers, outputs, ordering or summary; none of its generic option names, see options.py).

A session asks for the harness when any of:

1. it names the plugin: ``-p vllm_hil`` (command line, ``addopts``, ``PYTEST_ADDOPTS``), or it
   loads the plugin's modules itself rather than through the entry point (this repository's
   conftest.py: ``pytest_plugins = ["harness.plugin.hooks", ...]``; ``-p harness.plugin.hooks``);
2. it gives one of the harness's own options (``--require-device``, ``--hil-reports-dir``,
   ``--inject-fault``...: those whose ``opts_in`` is true in options.py; the generic names
   ``--model``, ``--target``, ``--stack``... do not, another project may have its own);
3. one of its test paths is in the harness's suites folder (the checkout's, or the installed
   copy's that ``hil suites`` runs; harness/core/paths.py).

Under xdist, a worker gets the controller's arguments, so it decides the same.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest

from harness.core.paths import SUITES_DIR
from harness.plugin.options import OPTIONS

PLUGIN = "vllm_hil"  # the entry point of harness.plugin.hooks: -p vllm_hil asks for the harness
FIXTURES = "vllm_hil_fixtures"  # registered on activation (fixture names like `model` are common)

OPTING_IN: tuple[str, ...] = tuple(o.name for o in OPTIONS if o.opts_in)

_REASON = pytest.StashKey["str | None"]()


def names_plugin(plugin_args: Iterable[str]) -> bool:
    """Whether the ``-p`` values ask for the harness (``no:vllm_hil`` does not)."""
    return PLUGIN in plugin_args


def gives_harness_option(args: Sequence[str]) -> bool:
    """Whether ``args`` hold one of the options that opt in (``--opt`` or ``--opt=value``;
    pytest refuses abbreviated options, so no prefix can name one)."""
    for arg in args:
        if arg == "--":
            return False
        if arg.split("=", 1)[0] in OPTING_IN:
            return True
    return False


def in_suites(paths: Iterable[str], start: Path, suites: Path = SUITES_DIR) -> bool:
    """Whether a test path (``file.py::test`` node ids too; relative to ``start``) is the
    harness's suites folder or inside it."""
    root = suites.resolve()
    for p in paths:
        if not p or p.startswith("-"):
            continue
        path = (start / p.split("::", 1)[0]).resolve()
        if path == root or root in path.parents:
            return True
    return False


HOOKS_MODULE = "harness.plugin.hooks"


def loaded_explicitly(config: pytest.Config) -> bool:
    """Whether the hooks module is registered under its module name, not its entry point's: a
    conftest's ``pytest_plugins`` or ``-p harness.plugin.hooks`` loaded it, not the autoload."""
    return config.pluginmanager.get_plugin(HOOKS_MODULE) is not None


def _all_args(config: pytest.Config) -> list[str]:
    """The command line with what pytest adds to it: the ini's addopts and PYTEST_ADDOPTS."""
    try:
        ini = list(config.getini("addopts") or [])
    except ValueError:
        ini = []
    env = shlex.split(os.environ.get("PYTEST_ADDOPTS", ""))
    return [*ini, *env, *(str(a) for a in config.invocation_params.args)]


def _parsed(config: pytest.Config) -> object:
    """What pytest parsed of the arguments so far: all of them from ``pytest_configure`` on;
    pytest's own (``-p``, the test paths) when the plugin's options are being registered."""
    return getattr(config, "known_args_namespace", None) or config.option


def _test_paths(config: pytest.Config) -> tuple[list[str], Path]:
    """The test paths given (relative to the invocation folder), else the ini's testpaths
    (relative to the rootdir)."""
    given = [str(a) for a in (getattr(_parsed(config), "file_or_dir", None) or [])]
    if given:
        return given, config.invocation_params.dir
    try:
        return [str(p) for p in config.getini("testpaths") or []], config.rootpath
    except ValueError:
        return [], config.invocation_params.dir


def decide(config: pytest.Config) -> str | None:
    """Why ``config``'s session asks for the harness (the rule of this module's docstring that
    holds first), or None when it does not. Decided when the plugin's options are registered
    (the generic ones only in a session that asks), from what pytest parsed by then."""
    if names_plugin(getattr(_parsed(config), "plugins", None) or []):
        return f"-p {PLUGIN}"
    if loaded_explicitly(config):
        return "plugin modules loaded by a conftest or -p"
    if gives_harness_option(_all_args(config)):
        return "a vllm-hil option"
    if in_suites(*_test_paths(config)):
        return "the vllm-hil suites"
    return None


def active_because(config: pytest.Config) -> str | None:
    """``decide``'s answer, decided once for the session (when the plugin's options are
    registered, or at the first hook that asks)."""
    if _REASON not in config.stash:
        config.stash[_REASON] = decide(config)
    return config.stash[_REASON]


def is_active(config: pytest.Config) -> bool:
    """Whether the harness acts in this session."""
    return active_because(config) is not None


def register_fixtures(config: pytest.Config) -> None:
    """Register the harness's fixtures (``hil``, ``model``, ``target_variant``) unless a conftest
    already did; blocked by ``-p no:vllm_hil_fixtures``."""
    from harness.plugin import fixtures

    pm = config.pluginmanager
    if not pm.is_registered(fixtures) and not pm.is_blocked(FIXTURES):
        pm.register(fixtures, FIXTURES)
