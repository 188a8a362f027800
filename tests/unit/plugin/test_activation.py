"""Which pytest sessions ask for the harness (harness/plugin/activation.py): the plugin named,
its modules loaded by a conftest, one of its own options, or its suites; nothing else."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.plugin import activation, fixtures, hooks
from harness.plugin.activation import (
    OPTING_IN,
    PLUGIN,
    SUITES_DIR,
    active_because,
    decide,
    gives_harness_option,
    in_suites,
    is_active,
    names_plugin,
)
from harness.plugin.options import OPTIONS

GENERIC = ("--model", "--target", "--stack", "--python", "--inventory", "--shard", "--quarantine")


class FakePluginManager:
    def __init__(self, names: dict[object, str] | None = None, blocked: tuple[str, ...] = ()):
        self.names = dict(names or {})
        self.blocked = blocked

    def get_name(self, plugin: object) -> str | None:
        return self.names.get(plugin)

    def get_plugin(self, name: str) -> object | None:
        return next((p for p, n in self.names.items() if n == name), None)

    def is_registered(self, plugin: object) -> bool:
        return plugin in self.names

    def is_blocked(self, name: str) -> bool:
        return name in self.blocked

    def register(self, plugin: object, name: str) -> str:
        self.names[plugin] = name
        return name


def fake_config(args: list[str] = (), plugins: list[str] = (), hooks_name: str | None = PLUGIN,
                test_paths: list[str] = (), addopts: list[str] = (), testpaths: list[str] = (),
                start: Path = Path("/elsewhere")):
    """A config as pytest makes it: the hooks module registered by its entry point (or
    ``hooks_name``), ``args`` on the command line, ``test_paths`` the test paths in them."""
    ini = {"addopts": list(addopts), "testpaths": list(testpaths)}
    return SimpleNamespace(
        known_args_namespace=SimpleNamespace(plugins=list(plugins), file_or_dir=list(test_paths)),
        pluginmanager=FakePluginManager({hooks: hooks_name} if hooks_name else {}),
        invocation_params=SimpleNamespace(args=tuple(args), dir=start),
        rootpath=SUITES_DIR.parent,
        getini=ini.__getitem__,
        stash=pytest.Stash(),
    )


@pytest.fixture(autouse=True)
def no_addopts_env(monkeypatch):
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)


def test_a_foreign_session_does_not_ask():
    config = fake_config(["-q", "tests", "-k", "model", "--model", "llama", "--target", "x86"])
    assert decide(config) is None
    assert not is_active(config)


@pytest.mark.parametrize("plugins, asks", [
    ([PLUGIN], True),
    (["xdist", PLUGIN], True),
    ([f"no:{PLUGIN}"], False),
    (["vllm_hil_allure"], False),
    ([], False),
])
def test_naming_the_plugin_asks(plugins, asks):
    assert names_plugin(plugins) is asks
    assert (decide(fake_config(plugins=plugins)) is not None) is asks


def test_the_modules_loaded_by_a_conftest_ask():
    # conftest.py's pytest_plugins (or -p harness.plugin.hooks) registers it by module name
    config = fake_config(hooks_name="harness.plugin.hooks")
    assert decide(config) == "plugin modules loaded by a conftest or -p"
    # the entry point's autoload alone does not, nor a blocked entry point
    assert decide(fake_config(hooks_name=PLUGIN)) is None
    assert decide(fake_config(hooks_name=None)) is None


@pytest.mark.parametrize("args", [
    ["--require-device"],
    ["--hil-reports-dir", "out"],
    ["--hil-reports-dir=out"],
    ["-q", "--inject-fault=perturb-logit", "tests"],
    ["--hil-plan"],
    ["--lease-dir", "/tmp/x"],
])
def test_a_harness_option_asks(args):
    assert gives_harness_option(args)
    assert decide(fake_config(args)) == "a vllm-hil option"


@pytest.mark.parametrize("name", GENERIC)
def test_a_generic_option_does_not_ask(name):
    assert name not in OPTING_IN
    assert not gives_harness_option([name, "x"])
    assert not gives_harness_option([f"{name}=x"])


def test_every_other_option_asks():
    assert set(OPTING_IN) == {o.name for o in OPTIONS} - set(GENERIC)


def test_options_after_a_double_dash_or_as_values_do_not_ask():
    assert not gives_harness_option(["--", "--require-device"])
    assert not gives_harness_option(["--require-devices", "--hil-reports-directory=x"])


def test_a_harness_option_in_addopts_or_the_environment_asks(monkeypatch):
    assert decide(fake_config(addopts=["--require-device"])) == "a vllm-hil option"
    monkeypatch.setenv("PYTEST_ADDOPTS", "-q --hil-reports-dir 'a b'")
    assert decide(fake_config()) == "a vllm-hil option"


def test_the_suites_ask(tmp_path):
    suite = str(SUITES_DIR / "test_capacity.py")
    assert in_suites([str(SUITES_DIR)], tmp_path)
    assert in_suites([f"{suite}::test_x[a-b]"], tmp_path)
    assert in_suites(["suites"], SUITES_DIR.parent)
    assert in_suites(["../suites/test_capacity.py"], SUITES_DIR.parent / "tests")
    assert decide(fake_config(test_paths=[suite])) == "the vllm-hil suites"
    # no test path given: the ini's testpaths, relative to the rootdir
    assert decide(fake_config(testpaths=["suites"])) == "the vllm-hil suites"
    assert decide(fake_config(test_paths=["tests"], testpaths=["suites"])) is None
    # its parent folder, a sibling, another project's suites folder: no
    assert not in_suites([str(SUITES_DIR.parent)], tmp_path)
    assert not in_suites([str(SUITES_DIR.parent / "tests")], tmp_path)
    (tmp_path / "suites").mkdir()
    assert not in_suites(["suites"], tmp_path)
    assert not in_suites(["-k", "--x"], SUITES_DIR)


def test_decided_once_per_session(monkeypatch):
    config = fake_config(plugins=[PLUGIN])
    assert active_because(config) == f"-p {PLUGIN}"
    monkeypatch.setattr(activation, "decide", lambda c: None)
    assert is_active(config)


def test_fixtures_registered_once_and_only_when_not_blocked():
    pm = FakePluginManager()
    config = SimpleNamespace(pluginmanager=pm)
    activation.register_fixtures(config)
    assert pm.names[fixtures] == activation.FIXTURES
    activation.register_fixtures(config)  # already registered (a conftest's): left as it is
    pm = FakePluginManager({fixtures: "harness.plugin.fixtures"})
    activation.register_fixtures(SimpleNamespace(pluginmanager=pm))
    assert pm.names[fixtures] == "harness.plugin.fixtures"
    pm = FakePluginManager(blocked=(activation.FIXTURES,))
    activation.register_fixtures(SimpleNamespace(pluginmanager=pm))
    assert fixtures not in pm.names


def test_this_checkout_asks_through_its_conftest(pytestconfig):
    assert active_because(pytestconfig) == "plugin modules loaded by a conftest or -p"


def test_without_the_harness_the_generic_options_are_not_registered():
    from _pytest.config.argparsing import Parser

    from harness.plugin.options import HOOKS, add_options

    names = {}
    for generic in (True, False):
        parser = Parser(_ispytest=True)
        add_options(parser, HOOKS, generic=generic)
        names[generic] = {n for g in parser._groups for o in g.options for n in o.names()}
    assert set(GENERIC) <= names[True]
    assert not set(GENERIC) & names[False]
    assert "--require-device" in names[False]
