"""``hil explore`` and ``hil nightly --explore`` hold to the bad-input rules
(docs/bad-input.md): their session is built the one way every session is
(harness.session.build), so every option and HIL_* variable is checked as pytest checks it;
bad input is refused before anything is written or started, with exit 2, on one screen, no
traceback, and an earlier search's findings byte-identical. The search itself never runs
here: an accepted input reaches a stub of ``explore`` (no engine starts)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from harness import cli
from harness.core.settings import VARIABLES
from harness.explore import command
from harness.session.build import BadSetting, check_environment
from harness.targets import kind
from tests.bad_input import INV, env_refuses, write

SCREEN = 25  # lines: a refusal a person reads at once
EARLIER = {
    "explore/findings.md": b"# hil explore: findings\n\n## finding 1a2b: [check kv_ledger]\n",
    "explore/test_finding_1a2b.py": b"def test_finding_1a2b():\n    pass\n",
    "summary.md": b"# an earlier run\n",
}
BAD_GROUP = INV + '\n[[group]]\nid = "pair0"\ndevices = ["card0", "card9"]\n'


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    """No HIL_* variable of the shell this runs in; the search never runs (a stub records
    each checked search that reached it)."""
    for name in [n for n in os.environ if n.startswith("HIL_")]:
        monkeypatch.delenv(name)
    searched: list = []
    monkeypatch.setattr(command, "explore", lambda search: searched.append(search) or 0)
    return searched


@pytest.fixture
def cores_for_two_ranks(monkeypatch):
    """A machine whose CPU engines run one or two ranks (TP 3 and up: not enough cores)."""
    def problem(cls, variant, ranks, stack):
        return None if ranks <= 2 else f"TP {ranks} needs {ranks} CPU cores, one per rank;" \
                                       " this process may use 2"
    for target in ("vllm-cpu", "spyre"):
        monkeypatch.setattr(kind(target), "tensor_parallel_problem", classmethod(problem))


def earlier_search(reports: Path) -> dict[Path, bytes]:
    files = {reports / name: data for name, data in EARLIER.items()}
    for path, data in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def run(argv: list[str], capsys) -> tuple[int, str]:
    """``hil ARGV``'s exit code and output (an argparse refusal's too)."""
    try:
        code = cli.main(argv)
    except SystemExit as e:
        code = int(e.code or 0)
    out = capsys.readouterr()
    return code, out.out + out.err


def assert_refused(code: int, output: str, *words: str) -> None:
    assert code == 2, output
    assert "Traceback" not in output and len(output.splitlines()) <= SCREEN, output
    for w in words:
        assert w in output, output


def explore_argv(tmp_path: Path, *args: str) -> list[str]:
    return ["explore", "--reports-dir", str(tmp_path / "reports"), "--cache-dir",
            str(tmp_path / "cache"), "--budget", "5", "--target", "vllm-cpu", *args]


# ------------------------------------------------------------ the one way: HIL_* variables


@pytest.mark.parametrize("variable, value", [
    ("HIL_ENGINE_START", "zygote"),
    ("HIL_PROBE_CHECKPOINT_EVERY", "x"),
    ("HIL_FULL_PROBE_MAX_BLOCKS", "-1"),
    ("HIL_ENGINE_START_TIMEOUT", "abc"),  # an option's variable hil explore has no option of
    ("HIL_NO_TRIAGE", "maybe"),
    ("HIL_LEASE_DIR", ""),  # empty: unset, accepted
])
def test_a_bad_variable_is_refused_by_hil_explore_as_pytest_refuses_it(
        tmp_path, capsys, monkeypatch, clean_environment, variable, value):
    earlier = earlier_search(tmp_path / "reports")
    monkeypatch.setenv(variable, value)
    code, output = run(explore_argv(tmp_path), capsys)
    if not value:
        assert code == 0 and clean_environment, output
        return
    pytest_says = _pytest_message(variable, value)
    assert_refused(code, output, f"hil explore: {pytest_says}")
    assert not clean_environment  # nothing searched
    assert snapshot(tmp_path / "reports") == {str(p.relative_to(tmp_path / "reports")): d
                                              for p, d in earlier.items()}


def _pytest_message(variable: str, value: str) -> str:
    """The message pytest's configure gives for ``variable=value`` (harness.plugin.options:
    check_settings), without its ``ERROR: `` prefix."""
    from harness.plugin.options import BY_NAME, EnvProblem, env_default

    var = next(v for v in VARIABLES if v.name == variable)
    if var.option is None:
        with pytest.raises(BadSetting) as e:
            check_environment({variable: value})
        return str(e.value)
    os.environ[variable] = value
    try:
        found = env_default(BY_NAME[var.option])
    finally:
        del os.environ[variable]
    assert isinstance(found, EnvProblem)
    return f"env {found}"


def test_the_session_honours_the_variables_pytest_honours(tmp_path, monkeypatch):
    """Built the one way, the search's session takes an option's variable the way pytest's
    does (it used to ignore HIL_ENGINE_START_TIMEOUT and HIL_LEASE_DIR: a lab's lease folder,
    and the devices leased in it, were not the suites')."""
    from harness.explore.session import SessionSettings, check_session

    monkeypatch.setenv("HIL_ENGINE_START_TIMEOUT", "900")
    monkeypatch.setenv("HIL_LEASE_DIR", str(tmp_path / "leases"))
    checked = check_session(SessionSettings(cache_dir=tmp_path / "c", reports_dir=tmp_path / "r",
                                            stack="default", call_timeout=30.0))
    assert checked.opts.start_timeout == 900.0 and checked.opts.call_timeout == 30.0
    assert checked.value("--lease-dir") == str(tmp_path / "leases")
    assert (checked.opts.triage, checked.opts.max_live_engines) == (False, 2)
    assert not (tmp_path / "c").exists() and not (tmp_path / "r").exists()  # nothing made


# ------------------------------------------------------------ inventories


@pytest.mark.parametrize("how", ["option", "variable"])
@pytest.mark.parametrize("body, words", [
    (None, "inventory file not found"),
    (BAD_GROUP, "group #1 ('pair0'): device 'card9' is not listed under [[device]]"),
])
def test_a_missing_or_wrong_inventory_is_refused_naming_it(tmp_path, capsys, monkeypatch, how,
                                                           body, words):
    earlier = earlier_search(tmp_path / "reports")
    inv = tmp_path / "inv.toml" if body is None else write(tmp_path, "inv.toml", body)
    argv = explore_argv(tmp_path)
    if how == "option":
        argv += ["--inventory", str(inv)]
    else:
        monkeypatch.setenv("HIL_INVENTORY", str(inv))
    code, output = run(argv, capsys)
    assert_refused(code, output, "hil explore: ", str(inv), words)
    assert snapshot(tmp_path / "reports") == {str(p.relative_to(tmp_path / "reports")): d
                                              for p, d in earlier.items()}


# ------------------------------------------------------------ tensor-parallel sizes, rank=


def test_a_tensor_parallel_size_no_target_runs_is_refused_not_replaced(
        tmp_path, capsys, cores_for_two_ranks, clean_environment):
    code, output = run(explore_argv(tmp_path, "--tensor-parallel", "3"), capsys)
    assert_refused(code, output, "hil explore: --tensor-parallel 3: no target variant searched"
                   " runs an engine of that many ranks here (vllm-cpu: TP 3: TP 3 needs 3 CPU"
                   " cores")
    assert not clean_environment


def test_sizes_some_target_runs_are_searched_the_others_said(tmp_path, capsys,
                                                            cores_for_two_ranks,
                                                            clean_environment):
    from harness.explore.session import tensor_parallel_sizes
    from harness.targets.variants import VARIANTS

    code, output = run(explore_argv(tmp_path, "--tensor-parallel", "2,3"), capsys)
    assert code == 0, output
    (search,) = clean_environment
    assert search.tensor_parallel == (2, 3)  # each variant's sizes: said when it is searched
    runs, said = tensor_parallel_sizes(VARIANTS["vllm-cpu"], (2, 3), "default")
    assert runs == (2,) and said == ["TP 3: TP 3 needs 3 CPU cores, one per rank; this process"
                                     " may use 2"]


@pytest.mark.parametrize("sizes, fault, refused", [
    ("1,2", "scale-partial-sum:rank=5", True),
    ("1", "scale-partial-sum:rank=1", True),
    ("1,2", "scale-partial-sum:rank=2", True),
    ("1,2", "scale-partial-sum:rank=1", False),
    ("1", "scale-partial-sum:rank=0", False),
    ("1", "scale-partial-sum", False),
])
def test_a_fault_rank_no_engine_of_the_search_has_is_refused(tmp_path, capsys,
                                                            cores_for_two_ranks,
                                                            clean_environment, sizes, fault,
                                                            refused):
    code, output = run(explore_argv(tmp_path, "--tensor-parallel", sizes, "--inject-fault",
                                    fault), capsys)
    if not refused:
        assert code == 0 and clean_environment, output
        return
    assert_refused(code, output, f"hil explore: --inject-fault: fault {fault!r}: rank=",
                   "is no rank of this run's engines", "installed nowhere")
    assert not clean_environment


# ------------------------------------------------------------ hil nightly --explore


@pytest.fixture
def suites(monkeypatch):
    """The nightly's suites never run here: each call's pytest arguments, exit code 0 (or
    what ``suites.code`` says)."""
    class Suites:
        code = 0
        calls: list[list[str]] = []

    seen = Suites()
    seen.calls = []

    def cmd_run(args, extra):
        seen.calls.append(extra)
        return seen.code

    monkeypatch.setattr(cli, "cmd_run", cmd_run)
    return seen


def nightly_argv(tmp_path: Path, *extra: str) -> list[str]:
    inv = write(tmp_path, "inv.toml", INV)
    return ["nightly", "--reports-dir", str(tmp_path / "reports"), "--inventory", str(inv),
            "--explore", "10", *extra]


@pytest.mark.parametrize("extra, env, words", [
    (["--model", ","], {}, "hil nightly --explore: --model ',' names no model"),
    (["--target", "bogus"], {}, "hil nightly --explore: --target: unknown target 'bogus'"),
    (["--inject-fault", "nope"], {}, "hil nightly --explore: --inject-fault: unknown fault"),
    ([], {"HIL_ENGINE_START": "zygote"}, "hil nightly --explore: env HIL_ENGINE_START: 'zygote'"),
    ([], {"HIL_MODEL": "a,b"}, None),  # the first model is searched: 'a', no such folder
])
def test_nightly_checks_its_search_before_its_suites(tmp_path, capsys, monkeypatch, suites,
                                                    clean_environment, extra, env, words):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    earlier = earlier_search(tmp_path / "reports")
    code, output = run(nightly_argv(tmp_path, *extra), capsys)
    assert_refused(code, output, words or "hil nightly --explore: --model: model folder not"
                   " found: a")
    assert suites.calls == [] and not clean_environment  # neither the suites nor the search
    assert snapshot(tmp_path / "reports") == {str(p.relative_to(tmp_path / "reports")): d
                                              for p, d in earlier.items()}


def test_nightly_runs_no_search_after_pytest_refused_the_arguments(tmp_path, capsys, suites,
                                                                  clean_environment):
    suites.code = 4
    code, output = run(nightly_argv(tmp_path, "--model", "tiny-llama"), capsys)
    assert code == 4 and len(suites.calls) == 1 and not clean_environment, output
    assert "the search (--explore) was not run" in output


def test_nightly_searches_after_its_suites_with_their_arguments(tmp_path, capsys, suites,
                                                               clean_environment):
    suites.code = 1
    code, output = run(nightly_argv(tmp_path, "--model", "tiny-granite,tiny-llama",
                                    "--inject-fault", "forget-free"), capsys)
    assert code == 1 and len(suites.calls) == 1, output
    (search,) = clean_environment
    assert (search.info.model, search.info.faults) == ("tiny-granite", ("forget-free",))


# ------------------------------------------------------------ generated input

TARGETS = {"vllm-cpu": True, "spyre-eager-cp": True, "spyre": True, "bogus": False, ",": False,
           "spyre-eager-sb": False}
MODELS = {"tiny-llama": True, "tiny-granite": True, ",": False, "tiny-llama,tiny-granite": False,
          "{tmp}/no-such-folder": False}
SIZES = {"1": (1,), "1,2": (1, 2), "2": (2,), "2,3": (2,), "3": (), "4,3": ()}
FAULTS = st.one_of(st.just(None), st.sampled_from(["forget-free", "no-such-fault",
                                                   "forget-free:bogus=1"]),
                   st.integers(0, 6).map(lambda r: f"scale-partial-sum:rank={r}"))
INVENTORIES = {"": True, "missing": False, "bad-group": False, "good": True}


def _expected_refusal(target, model, sizes, fault, inventory, nightly) -> bool:
    runs = SIZES[sizes]
    # a nightly searches its first model, on one rank per engine
    model_ok = MODELS[model] or (nightly and model == "tiny-llama,tiny-granite")
    if not (TARGETS[target] and model_ok and runs and INVENTORIES[inventory]):
        return True
    if fault in ("no-such-fault", "forget-free:bogus=1"):
        return True
    return fault is not None and "rank=" in fault and int(fault.rsplit("=", 1)[1]) >= max(runs)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(target=st.sampled_from(sorted(TARGETS)), model=st.sampled_from(sorted(MODELS)),
       sizes=st.sampled_from(sorted(SIZES)), fault=FAULTS,
       inventory=st.sampled_from(sorted(INVENTORIES)), nightly=st.booleans())
def test_a_random_search_is_run_or_refused_on_one_screen_nothing_changed(
        tmp_path_factory, capsys, monkeypatch, cores_for_two_ranks, clean_environment, target,
        model, sizes, fault, inventory, nightly):
    clean_environment.clear()
    tmp = tmp_path_factory.mktemp("search")
    reports = tmp / "reports"
    earlier = earlier_search(reports)
    before = snapshot(reports)
    if nightly and not inventory:
        inventory = "good"  # hil nightly: HIL_INVENTORY, else discovery: a file here
    inv = {"": "", "missing": str(tmp / "nope.toml"),
           "bad-group": str(write(tmp, "bad.toml", BAD_GROUP)),
           "good": str(write(tmp, "inv.toml", INV))}[inventory]
    given_ = ["--target", target, "--model", model.format(tmp=tmp),
              *(["--inject-fault", fault] if fault else [])]
    suites: list = []
    with monkeypatch.context() as m:
        m.setattr(cli, "cmd_run", lambda args, extra: suites.append(extra) or 0)
        if nightly:
            sizes = "1"  # the nightly's search: one rank per engine
            code, output = run(["nightly", "--reports-dir", str(reports), "--inventory", inv,
                                "--explore", "5", *given_], capsys)
        else:
            code, output = run(["explore", "--reports-dir", str(reports), "--cache-dir",
                                str(tmp / "cache"), "--budget", "5", "--tensor-parallel",
                                sizes, *given_, *(["--inventory", inv] if inv else [])], capsys)
    assert "Traceback" not in output and len(output.splitlines()) <= SCREEN, output
    if _expected_refusal(target, model, sizes, fault, inventory, nightly):
        assert code == 2, (given_, sizes, inventory, output)
        assert snapshot(reports) == before
        assert not clean_environment and not suites  # nothing searched, no suite run
    else:
        assert code == 0, (given_, sizes, inventory, output)
        assert len(clean_environment) == 1 and len(suites) == (1 if nightly else 0)
    assert all(p.read_bytes() == d for p, d in earlier.items())


# Variables whose type can refuse a random value (not text or paths: a random text is a
# text, a random relative path may be a folder).
CHECKED = [v for v in VARIABLES if not v.internal
           and v.value_type.name not in ("text", "path", "file", "folder", "writable-folder")]
ENV_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"),
                   min_size=1, max_size=20)


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(var=st.sampled_from(CHECKED), raw=st.one_of(ENV_TEXT, st.sampled_from(
    ["nan", "inf", "-1", "0", "1.5", "maybe", "zygote", "3/2", "1/2", "yes", "99999"])))
def test_a_random_variable_is_refused_by_hil_explore_exactly_when_pytest_refuses_it(
        tmp_path_factory, capsys, monkeypatch, clean_environment, var, raw):
    assume(raw.strip())
    clean_environment.clear()
    tmp = tmp_path_factory.mktemp("env")
    earlier = earlier_search(tmp / "reports")
    with monkeypatch.context() as m:
        m.setenv(var.name, raw)
        code, output = run(explore_argv(tmp), capsys)
    assert "Traceback" not in output and len(output.splitlines()) <= SCREEN, output
    if env_refuses(var.name, raw):
        assert code == 2 and f"hil explore: env {var.name}" in output, output
        assert not clean_environment
        assert snapshot(tmp / "reports") == {str(p.relative_to(tmp / "reports")): d
                                             for p, d in earlier.items()}
    else:
        assert code == 0, output
