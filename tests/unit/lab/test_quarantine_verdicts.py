"""hil explore's known failures are quarantine.toml entries, as data beside the suites' ones:
an entry names a suite test, an explorer verdict (check, targets, why, when) or both. The
loader reads the new keys strictly (an unknown key, a bad regular expression, an unknown
condition, explorer keys without a check: refused naming the file and entry), and the suites
read exactly the entries they read before."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.core.paths import REPO_ROOT
from harness.lab.quarantine import KnownFailure, load_known_verdicts, load_quarantine

SHIPPED = REPO_ROOT / "quarantine.toml"
ENTRY = 'reason = "r"\nissue = "I"\n'


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "q.toml"
    path.write_text(body, encoding="utf-8")
    return path


def test_the_suites_read_the_entries_they_read_before_and_the_explorer_its_own():
    suites = load_quarantine(SHIPPED, stacks=["default", "spyre-1.10", "legacy-spyre-0.4"])
    assert [k.test.split("[")[1].rstrip("]") for k in suites] == [
        "*-spyre-*-aborted-request-gives-its-blocks-back", "tiny-llama-vllm-cpu-bf16-pair",
        "tiny-llama-vllm-cpu-bf16-full-batch", "tiny-llama-vllm-cpu-bf16-over-batch"]
    assert suites[0].stacks == ("default",) and suites[1].cpu_lacks == ("avx512f",)
    explorer = load_known_verdicts(SHIPPED)
    assert [(k.check, k.when, k.why) for k in explorer] == [
        ("kv_ledger.promises", ("names_an_aborted_request",), ""),
        ("engine_error", ("aborts",), "scenario did not finish within"),
        ("kv_ledger.device_blocks", ("override_rounded_down",), ""),
        ("engine_error", ("block_past_the_rounded_cache",), ""),
    ]
    assert all(k.targets == ("spyre-",) and k.stacks == ("default",) for k in explorer)
    # one defect, one entry: the suite test and the explorer verdict of the kept promise
    assert explorer[0] == suites[0] and explorer[0].where.endswith("known #1")


def test_an_entry_of_an_explorer_verdict_holds_by_its_check_targets_why_and_stack(tmp_path):
    (k,) = load_known_verdicts(write(tmp_path, '[[known]]\ncheck = "engine_error"\ntargets = ["spyre-"]\n'
                                               'why = "did not finish within \\\\d+ steps"\n'
                                               'stacks = ["default"]\n' + ENTRY))
    assert k.test == "" and k.label == "engine_error"
    line = "EngineRequestError: scenario did not finish within 2000 steps"
    assert k.holds_for_verdict("engine_error", line, "spyre-eager-pc", "default")
    assert not k.holds_for_verdict("engine_error", line, "vllm-cpu", "default")
    assert not k.holds_for_verdict("engine_error", line, "spyre-eager-pc", "spyre-1.10")
    assert not k.holds_for_verdict("kv_ledger.promises", line, "spyre-eager-pc", "default")
    assert not k.holds_for_verdict("engine_error", "EngineCrashed: exited", "spyre-eager-pc",
                                   "default")
    assert load_quarantine(write(tmp_path, '[[known]]\ncheck = "x"\n' + ENTRY)) == []  # no test: not the suites'
    # no targets, no why: every variant, any first line
    assert KnownFailure("", "r", "I", check="x").holds_for_verdict("x", "", "vllm-cpu", "canary")
    assert not KnownFailure("t", "r", "I").holds_for_verdict("", "", "vllm-cpu", "default")


@pytest.mark.parametrize("body, said", [
    ('check = "x"\nwen = ["aborts"]\n', r"known #1: unknown field\(s\) \['wen'\] .*remove it or"
                                        r" fix its spelling"),
    ('check = "engine_error"\nwhy = "did not (finish"\n',
     r"known #1 \('engine_error'\): why 'did not \(finish' is no regular expression \(missing \),"
     r" unterminated subpattern at position 8\); fix it"),
    ('check = "engine_error"\nwhen = ["aborted"]\n',
     r"known #1 \('engine_error'\): when names 'aborted', which is no condition hil explore"
     r" knows \(aborts, names_an_aborted_request, override_rounded_down,"
     r" block_past_the_rounded_cache\); use one of them"),
    ('check = "engine_error"\nwhen = "aborts"\n',
     r"known #1: when 'aborts' is a string, expected a list; write a list \(when = \[\.\.\.\]"),
    ('test = "s.py::t"\ntargets = ["spyre-"]\nwhy = "x"\n',
     r"known #1 \('s.py::t'\): targets, why describe a hil explore verdict, and the entry names"
     r" no check; add check = \"CHECK\""),
    ('stacks = ["default"]\n', r"known #1: names neither a test nor a check; add test ="),
    ('check = "KV ledger"\n', r"known #1 \('KV ledger'\): check 'KV ledger' is no check id"),
    ('check = "x"\ntargets = ["spyr-"]\n', r"known #1 \('x'\): targets names 'spyr-', which"
                                           r" starts no target variant's id \(vllm-cpu, "),
    ('check = "x"\ntargets = []\n', r"known #1: targets \[\] lists 0, at least 1 needed; list 1 or more"),
    ('check = "x"\nstacks = ["nope"]\n', r"known #1 \('x'\): stacks names 'nope', which is no"
                                         r" stack"),
])
def test_a_bad_entry_of_an_explorer_verdict_is_refused_naming_the_file_and_entry(
        tmp_path, body, said):
    path = write(tmp_path, "[[known]]\n" + body + ENTRY)
    for load in (lambda: load_quarantine(path, stacks=["default"]),
                 lambda: load_known_verdicts(path, stacks=["default"])):
        with pytest.raises(ValueError, match=f"^{str(path)}: {said}"):
            load()  # the suites refuse it too: one file, one format
