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


class Chars:
    """One token per character: token ids are the characters' code points."""

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(map(chr, ids))


def test_prompts_sharing_a_prefix_diverge_where_declared():
    ps = PromptSet({**PROMPT_SET, "prompts": {
        "base": {"text": "abcdefgh", "length": 12},
        "split": {"text": "XY", "prefix": {"of": "base", "tokens": 5}, "length": 9},
        "repeat": {"text": "-", "prefix": {"of": "base", "tokens": 7}, "length": 7}},
        "cases": {"c": {"prompts": ["base", "split", "repeat"]}}}, "mem")
    base, split, repeat = (r.prompt_token_ids for r in ps.scenario("c", Chars()).requests)
    assert Chars().decode(base) == "abcdefghabcd"
    assert Chars().decode(split) == "abcdeXYXY" and split[:5] == base[:5] and split[5] != base[5]
    assert repeat == base[:7]


@pytest.mark.parametrize("prefix,message", [
    ({"of": "nope", "tokens": 2}, "must name another prompt of the set"),
    ({"of": "a", "tokens": 0}, "must name another prompt of the set"),
    ({"of": "b", "tokens": 2}, "must name another prompt of the set"),
])
def test_a_bad_prefix_is_refused(tmp_path, prefix, message):
    data = {**PROMPT_SET, "prompts": {"a": {"text": "hi"}, "b": {"text": "x", "prefix": prefix}}}
    p = write(tmp_path, "ps.json", json.dumps(data))
    with pytest.raises(ValueError, match=message):
        PromptSet.load(p)


def test_the_shipped_prefix_cases_share_and_diverge_at_block_edges():
    ps = PromptSet.load("token_equality")
    s = ps.scenario("shared-prefix", Chars())
    base = s.requests[0].prompt_token_ids
    for req, at in zip(s.requests[1:], (64, 96, 127), strict=True):
        assert req.prompt_token_ids[:at] == base[:at] and req.prompt_token_ids[at] != base[at]
    lengths = [len(r.prompt_token_ids) for r in ps.scenario("cached-edge", Chars()).requests[1:]]
    assert lengths == [127, 128, 129]
