"""The table of docs/bad-input.md: every bad argument or input file of a pytest run gives
one message naming the file or option, the value seen and what to do, with a documented
exit code, and loses nothing of an earlier run."""

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness.core.paths import REPO_ROOT
from tests.bad_input import INV, assert_nothing_lost, earlier_run, model_folder, write

ROOT = REPO_ROOT
SUITE = "suites/test_token_equality.py"
USAGE = 4  # pytest: arguments refused
NO_TESTS = 5  # pytest: no test was selected
LAB1 = ('[geometry.lab1]\ndescription = "a lab shape"\nmax_model_len = 512\nmax_num_seqs = 4\n'
        'chunk_size = 128\n')


@dataclass
class Row:
    """One row of the table, run as ``pytest SUITE ARGS`` in a child process."""

    id: str
    args: list[str]
    rc: int
    message: list[str]
    files: dict[str, str | bytes] = field(default_factory=dict)
    model: dict = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    absent: list[str] = field(default_factory=list)  # what the output must not say


ROWS = [
    # A run on a stack that is not installed would skip every test and pass for the wrong reason.
    Row("stack-not-installed", ["--stack", "neuron-config"], USAGE,
        ["--stack neuron-config: not installed", "run ./setup.sh --stack neuron-config"]),
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
    Row("target-unknown", ["--target", "not-a-kind"], USAGE,
        ["--target: unknown target 'not-a-kind'"]),
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
        ["--inject-fault: unknown fault 'nope'; known: abort-keeps-blocks, attn-scale, block-too-few"]),
    # A fault is installed only where the run says, as written: a spec that would install
    # nowhere, or raise in every engine, is refused before any engine starts.
    Row("inject-fault-variant-typo", ["--inject-fault", "forget-free:variant=vllm_cpu"], USAGE,
        ["--inject-fault: fault 'forget-free:variant=vllm_cpu': variant='vllm_cpu' is no target"
         " variant, so the fault would be installed nowhere; known: vllm-cpu, "]),
    Row("inject-fault-stack-unknown", ["--inject-fault", "forget-free:stack=spyre-9"], USAGE,
        ["stack='spyre-9' is no stack, so the fault would be installed nowhere; known: default, "]),
    Row("inject-fault-unknown-key", ["--inject-fault", "forget-free:bogus=1"], USAGE,
        ["--inject-fault: fault 'forget-free:bogus=1': unknown key(s) bogus; forget-free takes:"
         " after, variant, stack"]),
    Row("inject-fault-required-key-missing", ["--inject-fault", "open-other-card"], USAGE,
        ["--inject-fault: fault 'open-other-card': open-other-card needs address=VALUE"]),
    Row("inventory-fault-unknown-key", ["--inventory", "{inv.toml}"], USAGE,
        ["env HIL_FAULTS: fault 'crash-engine:at=start': unknown key(s) at; crash-engine takes:"
         " when, variant, stack"],
        {"inv.toml": INV + 'env = { HIL_FAULTS = "crash-engine:at=start" }\n'}),
    # A HIL_FAULTS the run did not set itself would be installed in every engine and named
    # in no report.
    Row("env-faults-inherited", [], USAGE,
        ["env HIL_FAULTS='forget-free': a fault from the environment would be installed in every"
         " engine of this run and named in no report; pass it as --inject-fault 'forget-free',"
         " or add --allow-external-faults to declare it for this run, or unset HIL_FAULTS"],
        env={"HIL_FAULTS": "forget-free"}),
    Row("env-faults-inherited-with-option", ["--inject-fault", "perturb-logit"], USAGE,
        ["env HIL_FAULTS='nope;forget-free:after=1': ", "pass it as --inject-fault 'nope'"
         " --inject-fault 'forget-free:after=1', or add --allow-external-faults"],
        env={"HIL_FAULTS": "nope;forget-free:after=1"}),
    # Declared by --allow-external-faults, it is checked as the run's own --inject-fault.
    Row("env-faults-allowed-are-checked", ["--allow-external-faults"], USAGE,
        ["--inject-fault: unknown fault 'nope'; known: abort-keeps-blocks,"],
        env={"HIL_FAULTS": "forget-free;nope"}),
    Row("help-writes-nothing", ["--help"], 0, ["--allow-external-faults"]),
    # Every option and variable typed once (harness/core/settings/): refused at the start,
    # naming the option (or the variable and its option), the value and the accepted form.
    Row("near-tie-tol-above-1", ["--near-tie-tol", "2"], USAGE,
        ["argument --near-tie-tol: '2' is out of range; expected a probability, a number in"
         " (0, 1]"]),
    Row("near-tie-topk-above-max-logprobs", ["--near-tie-topk", "50"], USAGE,
        ["argument --near-tie-topk: '50' is out of range; expected a whole number from 1 to 20"]),
    Row("logprob-tol-negative", ["--logprob-tol", "-1"], USAGE,
        ["argument --logprob-tol: '-1' is out of range; expected a tolerance"]),
    Row("engine-timeout-nan", ["--engine-timeout", "nan"], USAGE,
        ["argument --engine-timeout: 'nan' is not finite; expected seconds, a finite number"
         " above 0"]),
    Row("env-engine-start-timeout-not-a-number", [], USAGE,
        ["env HIL_ENGINE_START_TIMEOUT (option --engine-start-timeout): 'abc' is not a number",
         "fix or unset HIL_ENGINE_START_TIMEOUT"], env={"HIL_ENGINE_START_TIMEOUT": "abc"}),
    Row("help-with-a-bad-variable", ["--help"], 0, ["--engine-start-timeout"],
        env={"HIL_ENGINE_START_TIMEOUT": "abc"}),
    Row("env-flag-not-yes-no", [], USAGE,
        ["env HIL_REQUIRE_DEVICE (option --require-device): 'maybe' is not a yes/no value;"
         " expected a yes/no value, one of 1, true, yes, on, 0, false, no, off"],
        env={"HIL_REQUIRE_DEVICE": "maybe"}),
    Row("reports-dir-a-file", ["--hil-reports-dir", "{afile}"], USAGE,
        ["--hil-reports-dir: '", "afile' is a file, not a folder"], {"afile": "x"}),
    Row("reports-dir-read-only", ["--hil-reports-dir", "/proc"], USAGE,
        ["--hil-reports-dir: '/proc' is a folder this user cannot write in"]),
    Row("model-named-twice", ["--model", "tiny-llama,tiny-llama"], USAGE,
        ["--model: 'tiny-llama' is named twice; name each model once"]),
    Row("stack-a-path", ["--stack", "{x}"], USAGE,
        ["--stack: '", "x' is not a stack name", "not a path: ['default'"],
        {"x.toml": 'name = "x"\n'}),
    Row("collect-only-writes-nothing", ["--collect-only", "--model", "tiny-llama",
                                        "--target", "vllm-cpu"], 0, ["collected"]),
    # A lab geometry for a model no run can name would skip every test of it: a green run.
    Row("inventory-geometry-unknown-model", ["--inventory", "{inv.toml}", "--geometry", "lab1"],
        USAGE, ["inv.toml: geometry 'lab1': models: 'nope-model' is neither a tiny model nor a"
                " folder on this host; name a tiny model (tiny-llama, tiny-granite) or a model"
                " folder on this host"],
        {"inv.toml": INV + LAB1 + 'models = ["nope-model"]\n'}),
    Row("inventory-geometry-unknown-model-unselected", ["--inventory", "{inv.toml}"], USAGE,
        ["inv.toml: geometry 'lab1': models: 'nope-model' is neither a tiny model"],
        {"inv.toml": INV + LAB1 + 'models = ["nope-model"]\n'}),
    Row("inventory-geometry-model-folder-without-config", ["--inventory", "{inv.toml}"], USAGE,
        ["geometry 'lab1': models: '", "' is a folder without config.json"],
        {"inv.toml": INV + LAB1 + 'models = ["/"]\n'}),
    # The inventory's own error, not "unknown geometry" for the geometry it could not give.
    Row("inventory-key-twice-with-geometry", ["--inventory", "{inv.toml}", "--geometry", "lab1"],
        USAGE, ["inv.toml: invalid TOML: line 5, column 15: key 'kind' is defined twice"],
        {"inv.toml": INV + 'kind = "spyre"\n' + LAB1}, absent=["unknown geometry"]),
    Row("env-inventory-key-twice-with-geometry", ["--geometry", "lab1"], USAGE,
        ["inv.toml: invalid TOML: line 5, column 15: key 'kind' is defined twice"],
        {"inv.toml": INV + 'kind = "spyre"\n' + LAB1}, env={"HIL_INVENTORY": "{inv.toml}"},
        absent=["unknown geometry"]),
    Row("inventory-missing-with-geometry", ["--inventory", "{nope.toml}", "--geometry", "lab1"],
        USAGE, ["inventory file not found:", "nope.toml"], absent=["unknown geometry"]),
    Row("inventory-group-of-one", ["--inventory", "{inv.toml}"], USAGE,
        ["inv.toml: group #1 ('g'): devices ['card0'] lists 1, at least 2 needed; list 2 or"
         " more"], {"inv.toml": INV + '[[group]]\nid = "g"\ndevices = ["card0"]\n'},
        absent=["at least one entry"]),
    # rank= of no engine of the run would install the fault nowhere: a proof of nothing.
    Row("inject-fault-rank-beyond-one-rank", ["--inject-fault", "scale-partial-sum:rank=5"],
        USAGE, ["--inject-fault: fault 'scale-partial-sum:rank=5': rank=5 is no rank of this"
                " run's engines, which run 1 rank each (rank 0 only), so the fault would be"
                " installed nowhere; give rank=0, or run engines of more ranks"]),
    Row("inject-fault-rank-beyond-two-ranks", ["--inject-fault", "scale-partial-sum:rank=2",
                                               "--geometry", "small,tp2"], USAGE,
        ["rank=2 is no rank of this run's engines, which run 1 or 2 ranks each (ranks 0 to 1)"]),
    Row("inject-fault-rank-not-ascii", ["--inject-fault", "scale-partial-sum:rank=\u00b2"], USAGE,
        ["rank='\u00b2' is no rank; give a tensor-parallel rank, 0 for the first"]),
    # A selection of nothing is pytest's exit 5, not the stack's refusal of its variants.
    Row("k-selects-nothing", ["-k", "zzz_nothing"], NO_TESTS,
        ["vllm-hil: no test was selected (pytest exit 5): -m, -k, --target and the node ids"
         " leave no test"], absent=["--stack default: no test of this selection"]),
]


def child_pytest(tmp_path: Path, reports: Path, args: list[str],
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", SUITE,
           f"--hil-reports-dir={reports}", f"--alluredir={reports / 'allure-results'}",
           "--hil-clean-results", f"--lease-dir={tmp_path / 'leases'}", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def run_row(tmp_path: Path, row: Row) -> Path:
    """Run ``row`` as a child pytest over an earlier run's reports folder and assert what every
    row shares: its exit code, its message fragments, no traceback (but in --help), one ERROR line for a
    refusal, nothing of the earlier run lost, no timing written, no lease folder made. Returns
    the reports folder for a row's own assertions."""
    reports = tmp_path / "reports"
    earlier = earlier_run(reports)
    for name, body in row.files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        write(tmp_path, name, body)
    if row.model:
        model_folder(tmp_path, **row.model)
    # "{name}" stands for a path in this test's folder.
    args = [str(tmp_path / a[1:-1]) if a.startswith("{") else a for a in row.args]
    env = {k: str(tmp_path / v[1:-1]) if v.startswith("{") else v for k, v in row.env.items()}
    run = child_pytest(tmp_path, reports, args, env)
    out = run.stdout + run.stderr
    assert run.returncode == row.rc, out[-3000:]
    for fragment in row.message:
        assert fragment in out, out[-3000:]
    for fragment in row.absent:
        assert fragment not in out, out[-3000:]
    if "--help" not in row.args:  # pytest's help names its --tb "Traceback print mode"
        assert "Traceback" not in out and "INTERNALERROR" not in out, out[-3000:]
    if row.rc == USAGE:
        assert len([ln for ln in out.splitlines() if ln.startswith("ERROR:")]) == 1, out
    assert_nothing_lost(earlier)
    assert not (reports / "timing.json").exists() and not (tmp_path / "leases").exists()
    return reports


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_bad_argument_or_file_is_refused_and_loses_nothing(tmp_path, row):
    run_row(tmp_path, row)
    assert not (tmp_path / "escaped").exists()
