"""``SamplingSpec`` refuses what vLLM 0.28 refuses, converts to ``SamplingParams`` kwargs that vLLM
accepts unchanged, and never imports vLLM."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.sampling.params import SamplingParamsError, SamplingSpec, bad_words_token_ids

# (field values, the words the message must contain): each one vLLM refuses too.
REFUSED = [
    ({"temperature": -0.1}, "temperature must be in [0, 2]"),
    ({"temperature": 2.5}, "temperature must be in [0, 2]"),
    ({"temperature": float("nan")}, "temperature"),
    ({"top_p": 0.0}, "top_p must be in (0, 1]"),
    ({"top_p": 1.01}, "top_p must be in (0, 1]"),
    ({"top_k": -2}, "top_k"),
    ({"min_p": -0.1}, "min_p must be in [0, 1]"),
    ({"min_p": 1.5}, "min_p must be in [0, 1]"),
    ({"presence_penalty": 2.1}, "presence_penalty must be in [-2, 2]"),
    ({"frequency_penalty": -2.1}, "frequency_penalty must be in [-2, 2]"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"repetition_penalty": float("inf")}, "repetition_penalty"),
    ({"max_tokens": 0}, "max_tokens must be at least 1"),
    ({"min_tokens": -1}, "min_tokens must be >= 0"),
    ({"min_tokens": 5, "max_tokens": 4}, "min_tokens must be <= max_tokens=4"),
    ({"allowed_token_ids": ()}, "allowed_token_ids must not be empty"),
    ({"bad_words_text": ("",)}, "bad_words_text cannot contain an empty string"),
]


@pytest.mark.parametrize(("values", "message"), REFUSED, ids=[str(v) for v, _ in REFUSED])
def test_refused_naming_the_parameter_and_range(values: dict, message: str) -> None:
    with pytest.raises(SamplingParamsError) as refused:
        SamplingSpec(**values)
    assert message in str(refused.value)


@pytest.mark.parametrize(("values", "message"), REFUSED, ids=[str(v) for v, _ in REFUSED])
def test_vllm_refuses_the_same(values: dict, message: str) -> None:
    pytest.importorskip("vllm")
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError

    kwargs = {("bad_words" if k == "bad_words_text" else k): v for k, v in values.items()}
    kwargs = {k: (list(v) if isinstance(v, tuple) else v) for k, v in kwargs.items()}
    try:
        params = SamplingParams(**kwargs)
        params._validate_allowed_token_ids(None)  # the engine's own check, when the request arrives
    except (VLLMValidationError, ValueError):
        return
    pytest.fail(f"vLLM accepted {kwargs}")


ACCEPTED = [
    SamplingSpec(),
    SamplingSpec(
        temperature=2.0,
        top_p=1.0,
        top_k=-1,
        min_p=1.0,
        presence_penalty=-2.0,
        frequency_penalty=2.0,
        repetition_penalty=0.01,
        max_tokens=1,
        min_tokens=1,
    ),
    SamplingSpec(
        temperature=0.7,
        top_k=40,
        top_p=0.9,
        min_p=0.05,
        seed=7,
        logit_bias=((3, -100.0),),
        bad_words_text=("foo",),
        bad_words=((11,),),
        allowed_token_ids=(1, 2, 3),
        min_tokens=2,
        stop_token_ids=(9,),
        eos_token_ids=(2,),
    ),
]


@pytest.mark.parametrize("spec", ACCEPTED)
def test_vllm_accepts_the_kwargs_and_keeps_every_value(spec: SamplingSpec) -> None:
    pytest.importorskip("vllm")
    from vllm import SamplingParams

    params = SamplingParams(**spec.to_vllm_kwargs())
    for name in (
        "max_tokens",
        "top_k",
        "top_p",
        "min_p",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "min_tokens",
        "seed",
    ):
        if not spec.is_greedy or name not in ("top_k", "top_p", "min_p"):
            assert getattr(params, name) == getattr(spec, name), name
    assert params.temperature == spec.effective_temperature
    assert params.logit_bias == (spec.bias_by_token() or None)
    assert params.allowed_token_ids == (
        list(spec.allowed_token_ids) if spec.allowed_token_ids else None
    )
    assert params.stop_token_ids == list(spec.stop_token_ids)
    assert params.bad_words == list(spec.bad_words_text)
    params.update_from_generation_config({}, spec.eos_token_ids[0] if spec.eos_token_ids else None)
    assert params.all_stop_token_ids == spec.suppressed_until_min_tokens


def test_token_ids_outside_the_vocabulary_are_refused() -> None:
    SamplingSpec(logit_bias=((99, 1.0),)).check_vocab(100)
    with pytest.raises(SamplingParamsError, match=r"logit_bias: token ids \[99\].*\[0, 99\)"):
        SamplingSpec(logit_bias=((99, 1.0),)).check_vocab(99)


def test_allowed_ids_outside_the_vocabulary_are_refused() -> None:
    with pytest.raises(SamplingParamsError, match=r"allowed_token_ids: token ids \[-1\]"):
        SamplingSpec(allowed_token_ids=(-1, 3)).check_vocab(100)


class _WordTokenizer:
    """Each character is a token; a leading space merges with the next character (id + 100)."""

    max_token_id = 300

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if text.startswith(" "):
            return [ord(text[1]) + 100] + [ord(c) for c in text[2:]]
        return [ord(c) for c in text]


def test_bad_words_token_ids_as_vllm_derives_them() -> None:
    pytest.importorskip("vllm")
    from vllm import SamplingParams

    tokenizer = _WordTokenizer()
    words = ["ab", " cd", "e"]
    params = SamplingParams(bad_words=words)
    params.update_from_tokenizer(tokenizer)
    ours = bad_words_token_ids(tokenizer.encode, words)
    assert [list(w) for w in ours] == params.bad_words_token_ids


def test_the_package_does_not_import_vllm() -> None:
    code = (
        "import sys, harness.sampling.params, harness.sampling.pipeline, "
        "harness.sampling.judge, harness.sampling.noise; print('vllm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
