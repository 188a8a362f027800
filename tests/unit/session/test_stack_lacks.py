"""What a stack lacks: its stack file (pinned stacks) and the kinds' plugin generations."""

from __future__ import annotations

from harness.session.stack_lacks import stack_lacks, stacks_having
from harness.targets.variants import VARIANTS

LEGACY = "legacy-spyre-0.4"


def test_the_default_stack_lacks_the_modes_its_plugin_generation_removed():
    lacks = stack_lacks("default")
    assert list(lacks.entries) == ["spyre-eager-sb", "spyre-eager-cb", "spyre-sendnn-sb",
                                   "spyre-sendnn-cb"]
    # The skip message a test of it gave, and the stack file's shorter word for the summary.
    cb = lacks.entries["spyre-eager-cb"]
    assert cb.message.startswith("spyre-eager-cb does not run on stack default: sendnn-inference"
                                 " 2.x has no mode 'cb'")
    assert cb.reason.startswith("sendnn-inference 2.x removed plain continuous batching")


def test_the_default_stack_file_does_not_take_a_card_or_a_device_it_runs_unpinned():
    """The default stack runs as it is: a card variant is a missing device here, not a lack."""
    lacks = stack_lacks("default")
    for vid in ("vllm-cpu", "vllm-cpu-bf16", "spyre-eager-cp", "spyre-eager-pc",
                "spyre-sendnn-cp", "spyre-sendnn-pc", "neuron"):
        assert lacks.subject(VARIANTS[vid]) is None, vid


def test_a_pinned_stack_lacks_what_its_file_declares_and_what_it_does_not_list():
    lacks = stack_lacks(LEGACY)
    assert lacks.problem(VARIANTS["vllm-cpu"]) == (
        f"vllm-cpu does not run on stack {LEGACY}: vLLM 0.9.0.1 is an empty build"
        " (VLLM_TARGET_DEVICE=empty): no CPU kernels")
    assert lacks.problem(VARIANTS["vllm-cpu-bf16"]) == (
        f"vllm-cpu-bf16 is not among the targets of stack {LEGACY}")
    assert lacks.subject(VARIANTS["spyre-eager-cb"]) is None
    # A suite the stack lacks takes every variant, first.
    assert lacks.subject(VARIANTS["spyre-eager-cb"], ["cpu", "capacity"]) == "suite capacity"
    assert lacks.problem(VARIANTS["vllm-cpu"], ["capacity"]).startswith(
        f"suite capacity does not run on stack {LEGACY}: the plugin overwrites")


def test_reasons_group_the_variants_of_one_reason_then_the_suites():
    reasons = stack_lacks("canary").reasons()
    assert reasons[0] == (["spyre-eager-sb", "spyre-eager-cb", "spyre-eager-cp", "spyre-eager-pc"],
                          "no Spyre plugin supports vLLM 0.32 (sendnn-inference 2.6.3 requires"
                          " vllm<0.28.1)")
    assert stack_lacks(LEGACY).reasons()[-1][0] == ["suite capacity"]
    assert stack_lacks(LEGACY).reasons(["suite capacity"]) == [stack_lacks(LEGACY).reasons()[-1]]
    assert stack_lacks("canary").lines()[0].startswith("spyre-eager-sb, spyre-eager-cb, ")


def test_an_unknown_stack_lacks_nothing_here():
    assert not stack_lacks("no-such-stack")


def test_the_stacks_that_have_a_variant_are_those_whose_file_lists_it():
    assert stacks_having("spyre-eager-cb") == [LEGACY, "spyre-1.10"]
    assert stacks_having("spyre-eager-pc") == ["default"]
    assert stacks_having("spyre-sendnn-cp") == []  # a card host's own stack (host)
    assert "default" in stacks_having("suite capacity")
    assert LEGACY not in stacks_having("suite capacity")
