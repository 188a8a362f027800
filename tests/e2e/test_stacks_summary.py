"""End to end: `hil run --stacks default,legacy-spyre-0.4` on a narrow selection writes one
summary.md with the stack x suite x target matrix, what each stack does not have, the skips
grouped by reason, and each stack's section with its own agreement table (the default stack's
rows, the legacy stack's targets that cannot force listed outside the table).

The default stack (sendnn-inference 2.x) runs Spyre decoders in chunked prefill only
(spyre-eager-cp); continuous batching (spyre-eager-cb) is the legacy stack's, and neither
stack has the other's mode: each stack collects only what it has (the legacy stack no vllm-cpu
and no capacity suite either), and the summary says once per stack what it lacks. A card
target of a mode the stack has (spyre-sendnn-cp on the default stack) skips for the missing
device."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.stacks.spec import stack_python
from tests.suite_runner import ROOT

LEGACY = "legacy-spyre-0.4"

pytestmark = [
    pytest.mark.e2e,  # two child pytest runs, one per stack, with engines
    pytest.mark.skipif(stack_python(LEGACY) is None,
                       reason=f"stack {LEGACY} is not installed: run ./setup.sh --stack {LEGACY}"),
]


def section(text: str, heading_start: str) -> str:
    """The text from the line starting with ``heading_start`` to the next ``## `` heading."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading_start))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")),
               len(lines))
    return "\n".join(lines[start:end])


def matrix_cells(matrix: str) -> dict[tuple[str, str], dict[str, str]]:
    """(stack, target) -> suite -> cell of the matrix table (its header row names the suites)."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in matrix.splitlines() if line.startswith("| ")]
    header, body = rows[0], rows[1:]
    assert header[:2] == ["stack", "target"], header
    return {(r[0], r[1]): dict(zip(header[2:], r[2:], strict=True)) for r in body}


def test_two_stacks_make_one_summary_with_every_stacks_tables(tmp_path):
    reports = tmp_path / "reports"
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", "--reports-dir", str(reports),
         "--stacks", f"default,{LEGACY}", "--model", "tiny-llama",
         "--target", "vllm-cpu,spyre-eager-cp,spyre-eager-cb,spyre-sendnn-cp",
         "-k", "single-one-token or refuses_too_few_blocks"],
        cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    text = (reports / "summary.md").read_text()
    assert text.startswith(f"# vllm-hil run: 2 stacks (default, {LEGACY})"), text[:500]

    matrix = section(text, "## Stacks, suites and targets")
    cells = matrix_cells(matrix)
    suites = ("block_freeing", "capacity", "no_recompute", "token_equality")
    assert set(suites) <= set(next(iter(cells.values()))), matrix
    missing = "skipped: device missing"
    expected = {  # (stack, target) -> (capacity, token_equality); the other suites: —
        ("default", "vllm-cpu"): ("—", "1 passed"),
        ("default", "spyre-eager-cp"): ("1 passed", "1 passed"),
        ("default", "spyre-sendnn-cp"): (missing, missing),
        (LEGACY, "spyre-eager-cb"): ("—", "1 passed"),  # the stack has no capacity suite
    }
    assert set(cells) == set(expected), matrix
    for key, (capacity, token_equality) in expected.items():
        row = cells[key]
        assert (row["capacity"], row["token_equality"]) == (capacity, token_equality), (key, matrix)
        assert {v for k, v in row.items() if k not in ("capacity", "token_equality")} == {"—"}, \
            (key, matrix)

    skips = section(text, "## Skipped tests by reason")
    assert "### device missing: 2 test(s)" in skips and "| 2 | default |" in skips
    assert "### stack without the feature" not in skips  # not collected, not skipped
    lacks = section(text, "## What each stack does not have (not collected)")
    assert "| default | spyre-eager-sb | sendnn-inference 2.x removed static batching" in lacks
    assert f"| {LEGACY} | suite capacity | the plugin overwrites" in lacks
    assert f"| {LEGACY} | vllm-cpu | vLLM 0.9.0.1 is an empty build" in lacks

    default = section(text, "## Stack `default`")
    for target in ("spyre-eager-cp", "vllm-cpu"):
        assert f"| {target} | tiny-llama | " in default, default
    assert "| spyre-eager-cb | tiny-llama | " not in default, default
    assert "not forced" not in default
    legacy = section(text, f"## Stack `{LEGACY}`")
    forced = legacy.split("### Teacher-forced agreement")[1]
    assert f"- not forced: teacher forcing not run on {LEGACY}:spyre-eager-cb" in forced, legacy
    assert "| target | model |" not in forced  # no table of a header alone
    assert (reports / "stacks" / "default" / "summary.md").is_file()
    assert (reports / "stacks" / LEGACY / "stats").is_dir()
