"""The typed settings layer: each value type accepts its range and refuses the rest in one line
naming the option (or the variable and its option), the value and the accepted form; the
options and the variables are declared once, every HIL_* name the code reads is declared (by the settings layer, or by a target kind, whose
variables the kind registry registers), and every user-facing one is documented
(docs/configuration.md)."""

import argparse
import importlib.util
import re
from pathlib import Path

import pytest

import harness.targets  # noqa: F401 - the kind registry registers the kinds' variables
from harness.core.paths import REPO_ROOT
from harness.core.settings import (
    BY_OPTION,
    BY_VARIABLE,
    DECLARED_BY,
    MAX_LOGPROBS,
    VARIABLES,
    SettingError,
    Variable,
    env_problems,
    env_value,
    parse,
    register_variables,
)
from harness.plugin import options
from harness.plugin.options import BY_NAME, OPTIONS, EnvProblem, argparse_type, env_default
from tests.bad_input import model_folder

# ------------------------------------------------------------------ the value types


@pytest.mark.parametrize("kind, raw, value", [
    ("probability", "0.05", 0.05), ("probability", "1", 1.0), ("probability", " 0.5 ", 0.5),
    ("top-k", "1", 1), ("top-k", str(MAX_LOGPROBS), MAX_LOGPROBS),
    ("seconds", "0.5", 0.5), ("seconds", "1e3", 1000.0),
    ("tolerance", "0", 0.0), ("tolerance", "0.25", 0.25),
    ("count", "1", 1), ("whole", "0", 0), ("port", "0", 0), ("port", "65535", 65535),
    ("shard", "2/3", "2/3"), ("text", "anything", "anything"),
    ("flag", "TRUE", True), ("flag", "on", True), ("flag", "Yes", True), ("flag", "1", True),
    ("flag", "false", False), ("flag", "OFF", False), ("flag", "no", False), ("flag", "0", False),
])
def test_a_value_in_range_is_accepted(kind, raw, value):
    assert parse(kind, raw, "--opt") == value


@pytest.mark.parametrize("kind, raw, reason", [
    ("probability", "2", "is out of range"), ("probability", "0", "is out of range"),
    ("probability", "nan", "is not finite"), ("probability", "abc", "is not a number"),
    ("top-k", "0", "is out of range"), ("top-k", "50", "is out of range"),
    ("top-k", "2.5", "is not a whole number"),
    ("seconds", "0", "is out of range"), ("seconds", "-5", "is out of range"),
    ("seconds", "inf", "is not finite"), ("seconds", "nan", "is not finite"),
    ("tolerance", "-1", "is out of range"), ("count", "0", "is out of range"),
    ("port", "99999", "is out of range"), ("port", "-1", "is out of range"),
    ("shard", "3/2", "is out of range: I must be between 1 and N"),
    ("shard", "1", "is not of the form I/N"),
    ("flag", "maybe", "is not a yes/no value"), ("flag", "t", "is not a yes/no value"),
    ("path", "", "is empty"), ("text", "a\0b", "contains a NUL character"),
])
def test_a_bad_value_is_one_line_naming_the_option_value_and_form(kind, raw, reason):
    with pytest.raises(SettingError) as e:
        parse(kind, raw, "--opt")
    msg = str(e.value)
    assert msg.startswith(f"--opt: {raw!r} {reason}; expected "), msg
    assert "\n" not in msg and "pydantic" not in msg and "errors.pydantic.dev" not in msg


def test_a_variable_is_named_with_its_option_and_a_long_value_is_cut():
    with pytest.raises(SettingError, match=r"^HIL_ENGINE_START_TIMEOUT \(option"
                       r" --engine-start-timeout\): 'abc' is not a number; expected seconds"):
        env_value("HIL_ENGINE_START_TIMEOUT", {"HIL_ENGINE_START_TIMEOUT": "abc"})
    with pytest.raises(SettingError) as e:
        env_value("HIL_SHARD", {"HIL_SHARD": "x" * 500})
    assert len(str(e.value)) < 320 and "...'" in str(e.value)


def test_an_empty_or_unset_variable_is_the_default():
    assert env_value("HIL_ENGINE_START_TIMEOUT", {}, 7) == 7
    assert env_value("HIL_ENGINE_START_TIMEOUT", {"HIL_ENGINE_START_TIMEOUT": " "}, 7) == 7
    assert env_value("HIL_REQUIRE_DEVICE", {"HIL_REQUIRE_DEVICE": "false"}) is False


def test_a_writable_folder_is_checked_without_making_anything(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert parse("writable-folder", str(tmp_path / "new" / "deeper"), "--d") == str(
        tmp_path / "new" / "deeper")
    assert not (tmp_path / "new").exists() and sorted(tmp_path.iterdir()) == [afile]
    with pytest.raises(SettingError, match="is a file, not a folder"):
        parse("writable-folder", str(afile), "--d")
    with pytest.raises(SettingError, match=r"cannot be made: .*afile is a file"):
        parse("writable-folder", str(afile / "sub"), "--d")
    with pytest.raises(SettingError, match="is a folder this user cannot write in"):
        parse("writable-folder", "/proc", "--d")  # read-only even for root
    # The text alone is what an argument parser checks.
    assert parse("writable-folder", str(afile), "--d", on_disk=False) == str(afile)
    with pytest.raises(SettingError, match="does not exist"):
        parse("folder", str(tmp_path / "nope"), "--d")


# ------------------------------------------------------------------ the options


def _convert(name: str, raw: str):
    return argparse_type(BY_NAME[name])(raw)


@pytest.mark.parametrize("name, raw", [
    ("--near-tie-tol", "2"), ("--near-tie-tol", "nan"), ("--near-tie-topk", "0"),
    ("--near-tie-topk", "50"), ("--logprob-tol", "-1"), ("--logprob-tol-card", "-0.1"),
    ("--engine-timeout", "nan"), ("--engine-timeout", "0"), ("--engine-timeout", "-5"),
    ("--engine-timeout", "inf"), ("--lease-wait", "0"), ("--lease-wait", "inf"),
    ("--engine-start-timeout", "nan"), ("--max-live-engines", "0"),
    ("--max-live-engines", "1.5"), ("--shard", "0/2"),
    *((o.name, "0") for o in OPTIONS if o.name.startswith("--near-tie-tol-")),
])
def test_an_option_refuses_a_value_out_of_its_range_at_parse(name, raw):
    with pytest.raises(argparse.ArgumentTypeError, match=f"^{re.escape(repr(raw))} .*; expected"):
        _convert(name, raw)


def test_the_near_tie_options_are_typed_by_the_engines_max_logprobs():
    assert _convert("--near-tie-topk", str(MAX_LOGPROBS)) == MAX_LOGPROBS
    assert _convert("--near-tie-tol", "1") == 1.0
    assert [o.name for o in OPTIONS if o.name.startswith("--near-tie-tol-")], "no backend option"
    assert all(o.value_type.name == "probability" for o in OPTIONS
               if o.name.startswith("--near-tie-tol"))


def test_max_logprobs_is_the_engines(tmp_path):
    """The harness leaves vLLM's max_logprobs at its default: no kind raises it, and the
    constant is vLLM's default (read from its source, when vLLM is installed)."""
    from harness.core.config import EngineConfig
    from harness.targets import target_for

    cfg = EngineConfig(target="vllm-cpu", model="/m", max_model_len=256, max_num_seqs=4)
    assert target_for(cfg).llm_kwargs().get("max_logprobs", MAX_LOGPROBS) == MAX_LOGPROBS
    spec = importlib.util.find_spec("vllm")
    source = Path(spec.origin).parent / "config" / "model.py" if spec and spec.origin else None
    if source is None or not source.is_file():
        pytest.skip("vLLM's config source is not installed here")
    found = re.search(r"max_logprobs: int = Field\(default=(\d+)", source.read_text())
    assert found and int(found.group(1)) == MAX_LOGPROBS


def test_a_bad_variable_never_raises_at_registration(monkeypatch):
    for opt in OPTIONS:
        if opt.env:
            monkeypatch.setenv(opt.env, "\x7f not a value \x7f")
    for opt in OPTIONS:
        value = env_default(opt)
        if opt.env and opt.value_type.name not in ("text", "path", "folder", "writable-folder"):
            assert isinstance(value, EnvProblem), opt.name
            assert f"env {value}".startswith(f"env {opt.env} (option {opt.name}): ")


def test_a_flag_variable_is_strict(monkeypatch):
    opt = BY_NAME["--require-device"]
    for raw, want in (("false", False), ("0", False), ("no", False), ("", False),
                      ("true", True), ("ON", True), ("1", True)):
        monkeypatch.setenv("HIL_REQUIRE_DEVICE", raw)
        assert env_default(opt) is want, raw
    monkeypatch.setenv("HIL_REQUIRE_DEVICE", "2")
    assert isinstance(env_default(opt), EnvProblem)


class _Config:
    """What check_settings and check_models read of a pytest config."""

    def __init__(self, **values):
        self.values = {o.name: env_default(o) for o in OPTIONS} | values

    def getoption(self, name, default=None):
        return self.values.get(name, default)


def test_check_settings_refuses_a_bad_variable_naming_it(monkeypatch, tmp_path):
    monkeypatch.setenv("HIL_ENGINE_START_TIMEOUT", "abc")
    with pytest.raises(pytest.UsageError, match="env HIL_ENGINE_START_TIMEOUT .*'abc'"):
        options.check_settings(_Config())
    # replaced on the command line: not used, not refused
    options.check_settings(_Config(**{"--engine-start-timeout": 5.0,
                                      "--hil-reports-dir": str(tmp_path)}))
    options.check_settings(_Config(help=True))
    monkeypatch.delenv("HIL_ENGINE_START_TIMEOUT")
    monkeypatch.setenv("HIL_PROBE_CHECKPOINT_EVERY", "-1")
    with pytest.raises(pytest.UsageError, match="env HIL_PROBE_CHECKPOINT_EVERY: '-1' is out"):
        options.check_settings(_Config())


def test_check_settings_refuses_a_reports_dir_that_is_a_file(monkeypatch, tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(pytest.UsageError, match=r"^--hil-reports-dir: '.*' is a file"):
        options.check_settings(_Config(**{"--hil-reports-dir": str(tmp_path / "f")}))
    monkeypatch.setenv("HIL_REPORTS_DIR", str(tmp_path / "f"))
    with pytest.raises(pytest.UsageError, match=r"^HIL_REPORTS_DIR \(option --hil-reports-dir"):
        options.check_settings(_Config(**{"--hil-reports-dir": str(tmp_path / "f")}))


def test_a_model_named_twice_is_refused(tmp_path):
    from harness.plugin.selection import check_models

    with pytest.raises(pytest.UsageError, match="--model: 'tiny-llama' is named twice"):
        check_models(_Config(**{"--model": "tiny-llama,tiny-granite,tiny-llama"}))
    m = model_folder(tmp_path)
    with pytest.raises(pytest.UsageError, match="is the same folder as"):
        check_models(_Config(**{"--model": f"{m},{m}/"}))


@pytest.mark.parametrize("name", ["stacks/default.toml", "/etc/passwd", "../stacks/default",
                                  "default.toml", ""])
def test_a_stack_given_as_a_path_is_refused_with_the_list(name):
    from harness.stacks.spec import StackError, load_stack

    with pytest.raises(StackError, match=r"is not a stack name: .*not a path: \['default'"):
        load_stack(name)


# ------------------------------------------------------------------ the registry

SCANNED = ("harness", "fixtures", "bench", "tools", "stacks", "setup.sh")
SKIP_DIRS = {"node_modules", "__pycache__", ".venv"}
NAME = re.compile(r"\bHIL_[A-Z][A-Z0-9_]*")


def _scanned_files():
    for top in SCANNED:
        path = REPO_ROOT / top
        if path.is_file():
            yield path
            continue
        for p in path.rglob("*"):
            if p.is_file() and p.suffix in (".py", ".sh", ".toml") and not SKIP_DIRS & set(p.parts):
                yield p


def test_every_hil_variable_in_the_code_is_declared():
    found: dict[str, str] = {}
    for p in _scanned_files():
        for name in NAME.findall(p.read_text(errors="replace")):
            found.setdefault(name, str(p.relative_to(REPO_ROOT)))
    undeclared = {n: where for n, where in found.items() if n not in BY_VARIABLE}
    assert not undeclared, ("declare these in harness/core/settings/variables.py, or a kind's"
                            " in its kind's variables (and list them in"
                            f" docs/configuration.md): {undeclared}")
    assert {"HIL_INVENTORY", "HIL_ENGINE_AUTHKEY", "HIL_PYTHON"} <= set(found)


def test_each_option_variable_is_declared_once_with_its_option():
    with_env = {o.env: o.name for o in OPTIONS if o.env}
    assert with_env == {v.name: v.option for v in VARIABLES if v.option}
    assert len(BY_VARIABLE) == len(VARIABLES) and len(BY_OPTION) == len(with_env)
    for opt in OPTIONS:
        assert not (opt.env and opt.kind), f"{opt.name}: its type is its variable's"


def test_every_user_facing_variable_is_documented():
    page = (REPO_ROOT / "docs" / "configuration.md").read_text()
    for var in VARIABLES:
        line = next((ln for ln in page.splitlines() if ln.startswith(f"| `{var.name}` |")), "")
        assert line, f"{var.name} is not in docs/configuration.md"
        if var.option:
            assert f"`{var.option}`" in line, f"{var.name}: its option is not on its line"
        assert var.internal or var.option or var.doc, var.name


def test_the_engine_start_modes_are_the_fork_servers():
    from harness.engine.forkserver import MODES

    assert BY_VARIABLE["HIL_ENGINE_START"].value_type.form == f"one of {', '.join(MODES)}"


def test_env_problems_lists_each_bad_user_variable_once():
    env = {"HIL_SHARD": "9/2", "HIL_ENGINE_AUTHKEY": "not checked", "HIL_MODEL": "x",
           "HIL_FULL_PROBE_MAX_BLOCKS": "nan"}
    found = [e.where for e in env_problems(env)]
    assert found == ["HIL_SHARD (option --shard)", "HIL_FULL_PROBE_MAX_BLOCKS"]


def test_each_kind_declares_its_own_variables_once():
    """A kind's variables are declared by its kind module (``variables``) and registered by the
    kind registry, never by the settings layer under core."""
    from harness.targets import KINDS

    declared = [(k.name, var) for k in KINDS.values() for var in k.variables]
    assert declared, "no kind declares a variable: the registration is untested"
    for name, var in declared:
        assert BY_VARIABLE[var.name] is var and var in VARIABLES
        assert DECLARED_BY[var.name] == f"target kind {name}"
    assert DECLARED_BY["HIL_NEURON_ENGINE"] == "target kind neuron"


def test_a_registered_variable_is_declared_once(monkeypatch):
    from harness.core.settings import variables as registry

    for name in ("VARIABLES", "BY_VARIABLE", "BY_OPTION", "DECLARED_BY"):
        monkeypatch.setattr(registry, name, type(getattr(registry, name))(getattr(registry, name)))
    mine = Variable("HIL_KIND_THING", "whole", doc="a kind's own")
    register_variables([mine], "target kind tpu")
    register_variables([mine], "target kind tpu")  # the registry loaded again: no change
    assert registry.VARIABLES.count(mine) == 1 and registry.BY_VARIABLE["HIL_KIND_THING"] is mine
    assert registry.DECLARED_BY["HIL_KIND_THING"] == "target kind tpu"
    assert registry.env_value("HIL_KIND_THING", {"HIL_KIND_THING": "3"}) == 3
    with pytest.raises(ValueError, match="HIL_KIND_THING is declared by target kind tpu and"
                       " again by target kind other"):
        register_variables([mine], "target kind other")
    with pytest.raises(ValueError, match="HIL_MODEL is declared by harness.core.settings"):
        register_variables([Variable("HIL_MODEL", "text")], "target kind tpu")
    with pytest.raises(ValueError, match="sets option --model, which HIL_MODEL sets already"):
        register_variables([Variable("HIL_OTHER_MODEL", "text", option="--model")], "target kind tpu")
    with_option = Variable("HIL_TPU_FLAG", "flag", option="--tpu-flag")
    register_variables([with_option], "target kind tpu")
    assert registry.BY_OPTION["--tpu-flag"] is with_option
