"""What each stack lacks, as the run summary and the report's environment say it."""

from __future__ import annotations

from harness.report.run_config import RunOptions, environment_properties
from harness.report.stack_lacks_section import HEADING, lacks_markdown, lacks_property
from harness.report.summary import summary_text

LEGACY = "legacy-spyre-0.4"


def test_the_section_lists_per_stack_what_it_does_not_have_and_why():
    text = lacks_markdown(["default", LEGACY, "default"])
    lines = text.splitlines()
    assert lines[:4] == [HEADING, "", "| stack | not collected | why |", "|---|---|---|"]
    assert lines[4].startswith("| default | spyre-eager-sb | sendnn-inference 2.x removed static")
    assert sum(line.startswith("| default |") for line in lines) == 4  # once per stack
    assert f"| {LEGACY} | vllm-cpu | vLLM 0.9.0.1 is an empty build (VLLM_TARGET_DEVICE=empty):" \
           " no CPU kernels |" in lines
    assert lines[-1].startswith(f"| {LEGACY} | suite capacity | the plugin overwrites")
    assert lacks_markdown([]) == "" and lacks_markdown(["no-such-stack"]) == ""


def test_the_environment_says_what_the_runs_stack_lacks():
    assert lacks_property("canary")["stack.canary.lacks"].startswith(
        "spyre-eager-sb, spyre-eager-cb, spyre-eager-cp, spyre-eager-pc: no Spyre plugin")
    assert lacks_property("no-such-stack") == {}
    props = environment_properties(RunOptions(stack=LEGACY))
    assert "suite capacity: the plugin overwrites" in props[f"stack.{LEGACY}.lacks"]


def result(name: str, stack: str | None) -> dict:
    params = [{"name": "stack", "value": stack}] if stack else []
    return {"uuid": name, "name": name, "status": "passed", "parameters": params}


def test_a_single_stacks_summary_has_the_section_for_its_stack(tmp_path):
    text = summary_text([result("a", LEGACY)], [], tmp_path / "stats")
    assert HEADING in text and f"| {LEGACY} | suite capacity |" in text
    # Results that do not name their stack, or a summary asked without it: no section.
    assert HEADING not in summary_text([result("a", None)], [], tmp_path / "stats")
    assert HEADING not in summary_text([result("a", LEGACY)], [], tmp_path / "stats", lacks=False)
