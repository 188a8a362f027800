"""The engine process takes what it needs from the kinds by name (harness/in_engine/kind_modules.py):
the names its configuration carries are imported and called there, and no module under
harness/in_engine imports the kind registry or the harness side."""

from __future__ import annotations

import ast
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from harness.core.paths import REPO_ROOT
from harness.in_engine import kind_modules as km
from harness.in_engine.faults import FAULTS, apply_faults, conditions
from harness.in_engine.kind_modules import (
    BATCH_ORDER,
    KIND_MODULES,
    ForkParentModules,
    KindModules,
)

# Packages above the engine process: it is handed names instead of importing them.
ABOVE = ("harness.targets", "harness.engine", "harness.session", "harness.plugin", "harness.report")


def _imported(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


def test_no_engine_process_module_imports_the_kinds_or_the_harness_side():
    found = {str(p.relative_to(REPO_ROOT)): name
             for p in sorted((REPO_ROOT / "harness" / "in_engine").rglob("*.py"))
             for name in _imported(p) if name == "harness" or name.startswith(ABOVE)}
    assert found == {}


def test_the_names_go_through_the_configuration_and_back():
    names = KindModules(("a.faults",), ("a.ledger",), "a.kind:Kind.engine_info",
                        {BATCH_ORDER: "a.runner:publish"})
    config = {"target": "a", KIND_MODULES: names.to_dict()}
    assert KindModules.from_config(config) == names
    assert names.module_names() == ("a.faults", "a.ledger", "a.kind", "a.runner")
    # A configuration built without the harness side names nothing.
    assert KindModules.from_config({"target": "a"}) == KindModules()


def test_a_reference_names_a_module_and_an_attribute_path():
    assert km.resolve("os.path:join") is __import__("os").path.join
    assert km.resolve("json:JSONDecoder.decode") is __import__("json").JSONDecoder.decode
    for bad in ("os.path.join", ":join", "os.path:"):
        with pytest.raises(ValueError, match="not a reference of the form"):
            km.resolve(bad)


def _module(monkeypatch: pytest.MonkeyPatch, name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    monkeypatch.setitem(sys.modules, name, module)
    return module


def test_engine_info_and_runner_hooks_are_called_by_the_names_the_configuration_carries(
        monkeypatch):
    def publish(fn: Any) -> bool:
        return True

    _module(monkeypatch, "hil_kind_probe", facts=lambda: {"card": "x"}, publish=publish)
    config = {KIND_MODULES: KindModules(engine_info="hil_kind_probe:facts",
                                        runner_hooks={BATCH_ORDER: "hil_kind_probe:publish"})
              .to_dict()}
    assert km.engine_info(config) == {"card": "x"}
    assert km.runner_hook(config, BATCH_ORDER) is publish
    assert km.engine_info({}) == {} and km.runner_hook({}, BATCH_ORDER) is None


def facts_of_config(vllm_config: Any) -> dict[str, Any]:
    return {"got": vllm_config}


def facts_without_config() -> dict[str, Any]:
    return {"got": "nothing"}


def test_engine_info_passes_the_vllm_config_to_a_function_that_takes_one():
    def config_of(fn: str) -> dict[str, Any]:
        return {KIND_MODULES: KindModules(engine_info=f"{__name__}:{fn}").to_dict()}

    vllm_config = object()
    assert km.engine_info(config_of("facts_of_config"), vllm_config) == {"got": vllm_config}
    assert km.engine_info(config_of("facts_of_config")) == {"got": None}
    assert km.engine_info(config_of("facts_without_config"), vllm_config) == {"got": "nothing"}


def test_an_engine_loads_the_fault_modules_its_configuration_names(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("HIL_FAULTS", raising=False)
    (tmp_path / "hil_kind_faults.py").write_text(
        "from harness.in_engine.fault_registry import fault\n"
        "CALLS = []\n"
        "@fault('kind-named-fault')\n"
        "def named(config, **kw):\n"
        "    CALLS.append(kw)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = {"target": "vllm-cpu",
              KIND_MODULES: KindModules(fault_modules=("hil_kind_faults",)).to_dict()}
    with pytest.raises(ValueError, match="unknown fault 'kind-named-fault'"):
        apply_faults(["kind-named-fault"], {"target": "vllm-cpu"})  # named nowhere
    try:
        apply_faults(["kind-named-fault:x=1"], config)
        assert sys.modules["hil_kind_faults"].CALLS == [{"x": "1"}]
        assert list(FAULTS) == sorted(FAULTS)  # still in name order
    finally:
        FAULTS.pop("kind-named-fault", None)
        sys.modules.pop("hil_kind_faults", None)
    assert "[hil] fault installed: kind-named-fault:x=1" in capsys.readouterr().out


def test_a_fork_parent_reads_every_kinds_preload_map_and_modules_from_its_environment():
    sent = ForkParentModules({"plugin_a": ("plugin_a.worker", "plugin_a.runner")},
                             ("a.faults", "a.ledger"))
    assert ForkParentModules.from_env(sent.to_env()) == sent
    assert ForkParentModules.from_env("") == ForkParentModules()


@pytest.fixture
def row_corruption(monkeypatch):
    """``conditions._install_row_corruption`` with vLLM's scheduler, sampler and runner faked:
    what it patched, and whether it asked for vLLM's runner."""
    scheduler = type("Scheduler", (), {"schedule": lambda self: None})
    _module(monkeypatch, "vllm.v1.core.sched.scheduler", Scheduler=scheduler)
    asked: list[str] = []
    monkeypatch.setattr(conditions, "_INSTALLED", set())
    monkeypatch.setattr(conditions, "_STEP", {"due": {}, "rows": None})
    monkeypatch.setattr(conditions, "_patch_logits", lambda fn: asked.append("logits"))
    monkeypatch.setattr(conditions, "_vllm_runner", lambda: asked.append("vllm runner"))
    return asked


def test_a_kinds_batch_order_hook_publishes_the_rows_instead_of_vllms_runner(row_corruption,
                                                                            monkeypatch):
    published: list[Any] = []

    def hook(publish: Any) -> bool:
        published.append(publish)
        return True

    _module(monkeypatch, "hil_kind_runner", hook=hook)
    conditions._install_row_corruption(
        {KIND_MODULES: KindModules(runner_hooks={BATCH_ORDER: "hil_kind_runner:hook"}).to_dict()})
    assert row_corruption == ["logits"]  # vLLM's runner was not asked
    (publish,) = published
    publish(["r2", "r1"])
    assert conditions._STEP["rows"] == ["r2", "r1"]


def test_without_a_hook_or_where_it_declines_vllms_runner_publishes(row_corruption, monkeypatch):
    _module(monkeypatch, "hil_kind_runner", hook=lambda publish: False)
    conditions._install_row_corruption(
        {KIND_MODULES: KindModules(runner_hooks={BATCH_ORDER: "hil_kind_runner:hook"}).to_dict()})
    conditions._INSTALLED.clear()
    conditions._install_row_corruption({})
    assert row_corruption == ["vllm runner", "logits", "vllm runner", "logits"]
