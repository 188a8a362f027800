"""hil registry's arguments: a shape the registry has none of (``--tp 0``, ``--tp 3``, negative
shapes), a model folder without config.json or with one that is not JSON, are refused (exit 2)
with one message, before any row is built or file written, so an earlier registry.md stays as
it was. The registry here is a fake of the plugin's (its entries' tensor-parallel sizes); the
plugin's own runs in tests/e2e/test_registry.py."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import cli
from harness.targets.spyre import registry

GRANITE = "ibm-granite/granite-3.3-8b-instruct"
BIG = "ibm-granite/granite-4.1-30b"
EMBEDDING = "intfloat/multilingual-e5-large"


def _entry(*sizes: int) -> SimpleNamespace:
    return SimpleNamespace(continuous_batching_configs=[
        SimpleNamespace(tp_size=tp, max_model_len=512 * tp, max_num_seqs=4, device_config=None)
        for tp in sizes], architecture=SimpleNamespace(model_type="llama", attributes={}))


KNOWN = {GRANITE: _entry(1, 2, 4), BIG: _entry(4), EMBEDDING: _entry()}
EARLIER = b"| entry | TP |\n|---|---|\n| an earlier table | 4 |\n"


@pytest.fixture
def plugin(monkeypatch):
    """The plugin's registry faked (no vLLM, no plugin import); each row "built" as declared."""
    monkeypatch.setattr(registry, "plugin_problem", lambda: None)
    monkeypatch.setattr(registry, "plugin_registry", lambda: SimpleNamespace(_models=KNOWN))
    monkeypatch.setattr(registry, "hf_config", lambda architecture: {"model_type": "llama"})

    def built(reg, row, model_dir, declared):
        row.matched = row.entry
        return row

    monkeypatch.setattr(registry, "configure_row", built)


def folders(tmp_path: Path) -> dict[str, Path]:
    """Model folders: sound, without config.json, with config.json not JSON, not an object."""
    made = {}
    for name, config in (("sound", '{"model_type": "llama"}'), ("no-config", None),
                         ("not-json", '{"model_type": '), ("a-list", "[1, 2]"),
                         ("not-utf8", b"\xff\xfe{}")):
        folder = tmp_path / name
        folder.mkdir(exist_ok=True)
        if isinstance(config, str):
            (folder / "config.json").write_text(config)
        elif config is not None:
            (folder / "config.json").write_bytes(config)
        made[name] = folder
    return made


def hil_registry(reports: Path, *args: str) -> tuple[int, str]:
    """``hil registry ARGS --reports-dir REPORTS`` in this process: (exit code, its output)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            rc = cli.main(["registry", *args, "--reports-dir", str(reports)])
        except SystemExit as e:  # argparse refuses a value of the wrong type
            rc = int(e.code or 0)
    return rc, out.getvalue()


def earlier_table(reports: Path) -> Path:
    table = reports / "registry" / "registry.md"
    table.parent.mkdir(parents=True, exist_ok=True)
    table.write_bytes(EARLIER)
    return table


@pytest.mark.parametrize("args, message", [
    (["--tp", "0"], "argument --tp: '0' is out of range; expected a whole number, 1 or more"),
    (["--tp", "-2"], "argument --tp: '-2' is out of range; expected a whole number, 1 or more"),
    (["--model", GRANITE, "--tp", "3"], "hil registry: --tp 3: the plugin's registry has no"
     " decoder shape of tensor-parallel size 3; its sizes: 1, 2, 4; give one of them, or leave"
     " --tp out for all; nothing was written"),
    (["--model", BIG, "--tp", "2"], f"hil registry: --tp 2: '{BIG}' has no registered shape of"
     " tensor-parallel size 2; its sizes: 4;"),
    (["--model", EMBEDDING], f"hil registry: '{EMBEDDING}' has no decoder shape in the plugin's"
     " registry"),
    (["--model", "nope/model"], "hil registry: 'nope/model' is not in the plugin's registry, nor"
     " a model folder; registered: "),
    (["--model", ""], "hil registry: --model '' names no model;"),
    (["--model", "{no-config}", "--tp", "1", "--max-model-len", "512", "--max-num-seqs", "4"],
     "no-config: the folder has no config.json, which the registry matches a model by; copy the"
     " checkpoint's config.json into it; nothing was written"),
    (["--model", "{not-json}", "--tp", "1", "--max-model-len", "512", "--max-num-seqs", "4"],
     "not-json/config.json: not valid JSON (Expecting value at line 1, column 16); replace the"
     " file with the checkpoint's config.json"),
    (["--model", "{a-list}", "--tp", "1", "--max-model-len", "512", "--max-num-seqs", "4"],
     "a-list/config.json: has no \"model_type\" string"),
    (["--model", "{sound}", "--tp", "1", "--max-model-len", "-512", "--max-num-seqs", "4"],
     "argument --max-model-len: '-512' is out of range"),
    (["--model", "{sound}", "--tp", "1", "--max-model-len", "512", "--max-num-seqs", "0"],
     "argument --max-num-seqs: '0' is out of range"),
    (["--model", "{sound}", "--tp", "1"], "is a model folder: give --tp, --max-model-len and"
     " --max-num-seqs"),
])
def test_a_shape_the_registry_has_none_of_is_refused_and_the_earlier_table_kept(
        tmp_path, plugin, args, message):
    made = folders(tmp_path)
    table = earlier_table(tmp_path / "reports")
    args = [str(made[a[1:-1]]) if a.startswith("{") else a for a in args]
    rc, out = hil_registry(tmp_path / "reports", *args)
    assert rc == 2, out
    assert message in out, out
    assert "Traceback" not in out and len(out.splitlines()) <= 12, out
    assert table.read_bytes() == EARLIER
    assert not (tmp_path / "reports" / "registry" / "registry.json").exists()


def test_what_the_registry_has_is_tabled(tmp_path, plugin):
    made = folders(tmp_path)
    rc, out = hil_registry(tmp_path / "reports", "--model", GRANITE, "--tp", "2")
    assert rc == 0, out
    assert f"| {GRANITE} | 2 | 1024 | 4 |" in (tmp_path / "reports/registry/registry.md").read_text()
    rc, out = hil_registry(tmp_path / "reports", "--model", str(made["sound"]), "--tp", "4",
                           "--max-model-len", "512", "--max-num-seqs", "4")
    assert rc == 0, out


def test_the_sizes_are_the_registrys_own():
    assert registry.shapes_problem({"m": _entry(8)}, [], 8) is None
    assert "its sizes: 8;" in registry.shapes_problem({"m": _entry(8)}, [], 4)


# ------------------------------------------------------------------ generated arguments

NUMBER = st.one_of(st.none(), st.integers(min_value=-3, max_value=6).map(str),
                   st.sampled_from(["abc", "1.5", "", "nan", " 2"]))
MODEL = st.sampled_from([GRANITE, BIG, EMBEDDING, "nope/model", "", "{sound}", "{no-config}",
                         "{not-json}", "{a-list}", "{not-utf8}", "{missing}"])


def expected(models: list[str], tp: str | None, mml: str | None, mns: str | None,
             made: dict[str, Path]) -> bool:
    """Whether hil registry runs these arguments (else it refuses them, exit 2): the model
    written independently of the command's own checks."""
    numbers = {}
    for name, raw in (("tp", tp), ("mml", mml), ("mns", mns)):
        if raw is None:
            numbers[name] = None
            continue
        try:
            numbers[name] = int(raw)
        except ValueError:
            return False
        if numbers[name] < 1:
            return False
    folders_given = [m for m in models if m.startswith("{")]
    if (mml is not None or mns is not None) and not any(
            m in ("{sound}", "{no-config}", "{not-json}", "{a-list}", "{not-utf8}")
            for m in folders_given):
        return False  # only means something with a model folder (option_needs)
    sizes = {GRANITE: {1, 2, 4}, BIG: {4}, EMBEDDING: set()}
    if numbers["tp"] is not None and numbers["tp"] not in {1, 2, 4}:
        return False
    for m in models:
        if m in sizes:
            if not sizes[m] or (numbers["tp"] is not None and numbers["tp"] not in sizes[m]):
                return False
        elif m != "{sound}" or None in numbers.values():
            return False
    return True


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(models=st.lists(MODEL, max_size=3), tp=NUMBER, mml=NUMBER, mns=NUMBER)
def test_random_registry_arguments_run_or_are_refused_keeping_the_earlier_table(
        tmp_path, plugin, models, tp, mml, mns):
    made = folders(tmp_path)
    reports = tmp_path / "reports"
    table = earlier_table(reports)
    (reports / "registry" / "registry.json").unlink(missing_ok=True)
    args: list[str] = []
    for m in models:
        args += ["--model", str(made.get(m[1:-1], tmp_path / "missing")) if m.startswith("{")
                 else m]
    for option, raw in (("--tp", tp), ("--max-model-len", mml), ("--max-num-seqs", mns)):
        if raw is not None:
            args.append(f"{option}={raw}")
    rc, out = hil_registry(reports, *args)
    assert "Traceback" not in out, out
    if expected(models, tp, mml, mns, made):
        assert rc == 0, (args, out)
    else:
        assert rc == 2, (args, out)
        assert table.read_bytes() == EARLIER, args
        assert not (reports / "registry" / "registry.json").exists(), args
        message = [line for line in out.splitlines() if line.startswith("hil registry")]
        assert message and len(out.splitlines()) <= 12 and len(out) < 3000, out
