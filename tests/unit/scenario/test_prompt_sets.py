"""A prompt set file no engine can run is refused, naming the file, the case and the prompt."""

import json

import pytest

from harness.scenario.prompts import PromptSet
from tests.bad_input import write


def test_prompt_set_with_unknown_prompt(tmp_path):
    bad = {"name": "x", "engine": {"max_model_len": 128, "max_num_seqs": 2}, "max_tokens": 4,
           "prompts": {"a": {"text": "hi"}}, "cases": {"c": {"prompts": ["a", "nope"]}}}
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="case 'c' names unknown prompt 'nope'"):
        PromptSet.load(p)


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
