"""Property-based tests of the settings layer: any string for any declared option or variable
is either accepted, with a value inside the declared range, or refused with a SettingError
naming the option or variable; never another exception. Then a few child pytest runs with a
random bad variable: refused with exit 4, the variable named, no traceback.

Bounded (hypothesis max_examples): a few seconds in all."""

import argparse
import math
import os
import subprocess
import sys

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from harness.core.paths import REPO_ROOT
from harness.core.settings import MAX_LOGPROBS, VARIABLES, SettingError, env_value, parse
from harness.core.settings.values import FLAG_FALSE, FLAG_TRUE, shown
from harness.plugin.options import OPTIONS, EnvProblem, argparse_type, env_default
from tests.bad_input import env_refuses

# Text an environment can hold (no NUL, no lone surrogates) and numbers written every way.
ENV_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"),
                   max_size=40)
NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.floats(allow_nan=True, allow_infinity=True).map(lambda f: f"{f:g}"),
    st.integers(min_value=-10**30, max_value=10**30).map(str),
    st.sampled_from(["nan", "-nan", "inf", "-inf", "Infinity", "1e309", "-0", "0x10", "1_000",
                     " 5 ", "5.0", "1/2", "0/0", "2/1", "20", "21", "65536", "1e-320", "true",
                     "No", "oN", "", " "]),
)
RAW = st.one_of(ENV_TEXT, NUMBERS, st.text(max_size=20))

TYPED = [o for o in OPTIONS if o.action is None and o.value_type.name != "text"]
USER_VARIABLES = [v for v in VARIABLES if not v.internal]


def in_range(type_name: str, value: object) -> bool:
    """Whether an accepted value is inside its type's declared range."""
    finite = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if type_name == "probability":
        return finite and 0 < value <= 1
    if type_name == "top-k":
        return isinstance(value, int) and 1 <= value <= MAX_LOGPROBS
    if type_name == "seconds":
        return finite and value > 0
    if type_name == "tolerance":
        return finite and value >= 0
    if type_name == "count":
        return isinstance(value, int) and value >= 1
    if type_name == "whole":
        return isinstance(value, int) and value >= 0
    if type_name == "port":
        return isinstance(value, int) and 0 <= value <= 65535
    if type_name == "flag":
        return isinstance(value, bool)
    if type_name == "shard":
        i, n = (int(x) for x in str(value).split("/"))
        return 1 <= i <= n
    if type_name.startswith("one of "):
        return value in type_name.removeprefix("one of ").split("/")
    return isinstance(value, str) and "\0" not in value  # text and paths (as text)


@settings(max_examples=400, deadline=None)
@given(opt=st.sampled_from(TYPED), raw=RAW)
def test_an_option_value_is_in_range_or_refused_naming_the_option(opt, raw):
    convert = argparse_type(opt)
    try:
        value = convert(raw)
    except argparse.ArgumentTypeError as e:
        # argparse adds "argument --name: " before it
        assert str(e).startswith(f"{shown(raw)} ") and "; expected " in str(e), str(e)
        assert "\n" not in str(e)
        return
    assert (value == "" and opt.declared_default() == "") or in_range(opt.value_type.name, value)


@settings(max_examples=400, deadline=None)
@given(var=st.sampled_from(USER_VARIABLES), raw=RAW)
def test_a_variable_value_is_in_range_or_refused_naming_it(var, raw):
    try:
        value = env_value(var.name, {var.name: raw})
    except SettingError as e:
        assert str(e).startswith(f"{var.where()}: "), str(e)
        assert "\n" not in str(e)
        return
    assert value is None if not raw.strip() else in_range(var.value_type.name, value)


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(opt=st.sampled_from([o for o in OPTIONS if o.env]), raw=ENV_TEXT)
def test_registration_never_raises_for_any_variable(monkeypatch, opt, raw):
    monkeypatch.setenv(opt.env, raw)
    value = env_default(opt)
    if isinstance(value, EnvProblem):
        assert str(value).startswith(f"{opt.env} (option {opt.name}): ")
    else:
        assert (not raw.strip() or opt.value_type.name in ("text", "path", "folder",
                                                           "writable-folder")
                or in_range(opt.value_type.name, value)), value


SEGMENT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0/"),
                  min_size=1, max_size=300).filter(lambda s: s not in (".", ".."))


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["file", "folder", "writable-folder"]), name=SEGMENT,
       layout=st.sampled_from(["missing", "file", "folder", "under-a-file"]))
def test_a_path_is_checked_on_disk_or_refused_naming_the_option(tmp_path, kind, name, layout):
    base = tmp_path / "fuzz"
    base.mkdir(exist_ok=True)
    target = base / name
    try:
        if layout == "file":
            target.write_text("x")
        elif layout == "folder":
            target.mkdir()
        elif layout == "under-a-file":
            (base / "f").write_text("x")
            target = base / "f" / name
    except OSError:
        assume(False)  # a name this file system refuses: nothing to check
    try:
        parse(kind, str(target), "--opt")
    except SettingError as e:
        assert str(e).startswith("--opt: ") and "\n" not in str(e)
    finally:
        for p in sorted(base.rglob("*"), reverse=True):
            if p.is_dir():
                p.rmdir()
            else:
                p.unlink()
    assert sorted(base.iterdir()) == []  # nothing made, no probe left


# Variables a child pytest reads at its start, whose type can refuse a random value; not the
# paths (a random relative path may well be a folder it could write in).
CHECKED = [v for v in USER_VARIABLES
           if v.value_type.name not in ("text", "path", "file", "folder", "writable-folder")
           and not v.name.startswith("HIL_CARD_HOST_")]


@settings(max_examples=4, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])
@given(var=st.sampled_from(CHECKED), raw=st.one_of(ENV_TEXT, NUMBERS))
def test_a_child_pytest_refuses_a_random_bad_variable(tmp_path, var, raw):
    assume(raw.strip() and env_refuses(var.name, raw))
    env = {k: v for k, v in os.environ.items() if not k.startswith("HIL_")}
    env[var.name] = raw
    reports = tmp_path / "reports"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--collect-only",
         "suites/test_token_equality.py", "--model", "tiny-llama", "--target", "vllm-cpu",
         f"--hil-reports-dir={reports}", f"--lease-dir={tmp_path / 'leases'}"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, env=env)
    out = run.stdout + run.stderr
    assert run.returncode == 4, out[-2000:]
    assert f"env {var.name}" in out, out[-2000:]
    assert "Traceback" not in out and "INTERNALERROR" not in out, out[-2000:]
    assert not reports.exists()


def test_the_flag_words_are_the_documented_ones():
    assert FLAG_TRUE == ("1", "true", "yes", "on") and FLAG_FALSE == ("0", "false", "no", "off")
