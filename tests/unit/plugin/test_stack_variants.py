"""Collection on a stack: only the variants (and suites) the stack has are collected; a selection
that leaves the stack no test is refused, naming the stack and what it lacks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.core.paths import REPO_ROOT
from harness.plugin import stack_variants
from harness.plugin.stack_variants import (
    EMPTIED_KEY,
    LEFT_OUT_KEY,
    drop_emptied,
    empty_stack_refusal,
    lacks_lines,
    offered,
    refuse_empty_stack,
)
from harness.targets.variants import VARIANTS

LEGACY = "legacy-spyre-0.4"
USAGE = 4


class Config:
    """The parts of a pytest config the filter reads: --stack, the stash, the hooks."""

    def __init__(self, stack: str, worker: bool = False) -> None:
        self.stack = stack
        self.stash = pytest.Stash()
        self.deselected: list[object] = []
        self.hook = SimpleNamespace(pytest_deselected=lambda items: self.deselected.extend(items))
        self.option = SimpleNamespace(keyword="", markexpr="")
        self.said: list[str] = []
        reporter = SimpleNamespace(write_line=self.said.append)
        self.pluginmanager = SimpleNamespace(get_plugin=lambda name: reporter)
        if worker:
            self.workerinput = {"workerid": "gw0"}

    def getoption(self, name: str) -> str:
        assert name == "--stack", name
        return self.stack


def metafunc(config: Config, nodeid: str, *markers: str) -> SimpleNamespace:
    marks = [SimpleNamespace(name=m) for m in markers]
    return SimpleNamespace(config=config, definition=SimpleNamespace(
        nodeid=nodeid, iter_markers=lambda: iter(marks)))


def variants(*ids: str) -> list:
    return [VARIANTS[i] for i in ids]


def test_the_variants_a_stack_lacks_are_left_out_and_recorded():
    config = Config("default")
    kept = offered(metafunc(config, "suites/test_x.py::test_a", "token_equality"),
                   variants("vllm-cpu", "spyre-eager-cb", "spyre-eager-cp", "spyre-sendnn-cp"))
    # A card variant the stack has stays: without a card it skips saying so (device missing).
    assert [v.id for v in kept] == ["vllm-cpu", "spyre-eager-cp", "spyre-sendnn-cp"]
    assert list(config.stash[LEFT_OUT_KEY]) == ["spyre-eager-cb"]
    assert EMPTIED_KEY not in config.stash


def test_a_suite_the_stack_lacks_takes_every_variant_of_its_tests():
    config = Config(LEGACY)
    kept = offered(metafunc(config, "suites/test_capacity.py::test_c", "capacity"),
                   variants("spyre-eager-cb", "spyre-eager-sb"))
    assert kept == []
    assert list(config.stash[LEFT_OUT_KEY]) == ["suite capacity"]
    assert config.stash[EMPTIED_KEY] == {"suites/test_capacity.py::test_c"}
    # pytest's placeholder items of that test are deselected, the others kept.
    items = [SimpleNamespace(nodeid="suites/test_capacity.py::test_c[tiny-llama-target_variant0]"),
             SimpleNamespace(nodeid="suites/test_capacity.py::test_cd[tiny-llama-spyre-eager-cb]")]
    kept_items = list(items)
    drop_emptied(config, kept_items)
    assert kept_items == items[1:] and config.deselected == items[:1]


def test_a_test_with_no_variant_selected_is_not_the_stacks_doing():
    config = Config(LEGACY)
    assert offered(metafunc(config, "suites/test_x.py::test_a"), []) == []
    assert EMPTIED_KEY not in config.stash


def test_an_empty_collection_the_stack_made_is_a_usage_error_naming_what_it_lacks():
    config = Config("default")
    offered(metafunc(config, "suites/test_x.py::test_a"), variants("spyre-eager-sb"))
    with pytest.raises(pytest.UsageError) as refused:
        refuse_empty_stack(SimpleNamespace(shouldfail=False), config, [])
    text = str(refused.value)
    assert text.startswith("--stack default: no test of this selection runs on stack default:"
                           " it does not have spyre-eager-sb (sendnn-inference 2.x removed static"
                           " batching for decoders (pooling models only); stacks that have them:"
                           f" {LEGACY}, spyre-1.10)")
    assert "-m, -k, --target or the node ids leave no other test" in text
    # Tests left: nothing to refuse. An xdist worker stops its session with the reason instead.
    refuse_empty_stack(SimpleNamespace(shouldfail=False), config, [object()])
    worker, session = Config("default", worker=True), SimpleNamespace(shouldfail=False)
    worker.stash[LEFT_OUT_KEY] = {"spyre-eager-sb": None}
    refuse_empty_stack(session, worker, [])
    assert session.shouldfail == text


def test_an_empty_selection_the_stack_left_alone_is_pytests_own():
    refuse_empty_stack(SimpleNamespace(shouldfail=False), Config("default"), [])  # no raise


@pytest.mark.parametrize("keyword, markexpr, refused", [
    ("zzz_nothing", "", False),  # nothing anyway: pytest's exit 5, said as such
    ("spyre-eager-sb", "", True),  # only the variant the stack left out: the stack's doing
    ("test_a and not vllm", "", True),
    ("tiny-llama and spyre-eager-sb", "", True),  # a parameter id beside the variant's
    ("", "token_equality", True),
    ("", "capacity", False),
    ("", "token_equality and not token_equality", False),
])
def test_the_stack_is_named_only_where_the_selection_would_have_run_what_it_left_out(
        keyword, markexpr, refused):
    config = Config("default")
    meta = metafunc(config, "suites/test_x.py::test_a", "token_equality")
    meta._calls = [SimpleNamespace(id="tiny-llama")]
    offered(meta, variants("vllm-cpu", "spyre-eager-sb"))
    config.option = SimpleNamespace(keyword=keyword, markexpr=markexpr)
    if refused:
        with pytest.raises(pytest.UsageError, match="--stack default: no test of this selection"):
            refuse_empty_stack(SimpleNamespace(shouldfail=False), config, [])
        assert config.said == []
    else:
        refuse_empty_stack(SimpleNamespace(shouldfail=False), config, [])
        assert config.said == ["vllm-hil: no test was selected (pytest exit 5): -m, -k, --target"
                               " and the node ids leave no test"]


def test_the_refusal_groups_what_the_stack_lacks_by_reason():
    text = empty_stack_refusal("canary", ["spyre-eager-cb", "spyre-eager-cp", "neuron"])
    assert ("it does not have spyre-eager-cb, spyre-eager-cp (no Spyre plugin supports vLLM 0.32"
            " (sendnn-inference 2.6.3 requires vllm<0.28.1); stacks that have them: default,"
            f" {LEGACY}, spyre-1.10); neuron (") in text


def test_the_terminal_summary_says_what_the_stack_lacks():
    lines = lacks_lines(Config(LEGACY))
    assert lines[0] == f"stack {LEGACY} does not have (not collected):"
    assert f"  vllm-cpu-bf16, spyre-eager-np, spyre-sendnn-cp, spyre-sendnn-np, neuron: not among" \
           f" the targets of stack {LEGACY}" in lines
    assert lines[-1].startswith("  suite capacity: the plugin overwrites")
    assert lacks_lines(Config("no-such-stack")) == []


def _collect(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--collect-only",
         "suites/test_token_equality.py", "--model", "tiny-llama",
         f"--hil-reports-dir={tmp_path / 'reports'}", *args],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)


def test_a_run_collects_only_the_variants_its_stack_has(tmp_path):
    run = _collect(tmp_path, "--target", "spyre-eager-cb,spyre-eager-cp", "-k", "single")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    ids = [line for line in run.stdout.splitlines() if "::" in line]
    assert ids and all("spyre-eager-cp" in i for i in ids), ids


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "xdist"])
def test_a_selection_the_stack_has_none_of_is_refused(tmp_path, workers):
    run = _collect(tmp_path, "--target", "spyre-eager-cb", *workers)
    assert run.returncode == USAGE, run.stdout[-2000:] + run.stderr[-2000:]
    assert ("ERROR: --stack default: no test of this selection runs on stack default: it does"
            " not have spyre-eager-cb (sendnn-inference 2.x removed plain continuous batching") \
        in run.stdout + run.stderr


def test_the_module_is_what_selection_calls():
    from harness.plugin import selection

    assert selection.stack_variants is stack_variants


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "xdist"])
def test_a_selection_of_nothing_exits_5_saying_so(tmp_path, workers):
    # It said "--stack default: no test of this selection runs on stack default" (exit 4).
    run = _collect(tmp_path, "-k", "zzz_nothing", *workers)
    out = run.stdout + run.stderr
    assert run.returncode == 5, out[-2000:]
    assert "vllm-hil: no test was selected (pytest exit 5)" in out and "--stack" not in out
