"""An example is data: its JSON reads back equal, a bad one is refused naming what is wrong,
and its scenario has the shapes it says (prompt lengths, shared prefixes, arrivals, aborts)."""

from __future__ import annotations

import json

import pytest

from harness.explore.example import (
    FORMAT,
    Example,
    ExampleError,
    RequestShape,
    example_from_dict,
    geometry_of,
    geometry_values,
)
from harness.geometry.catalog import GeometryError
from tests.unit.explore.fakes import CharTokenizer

VALUES = {"max_model_len": 256, "max_num_seqs": 2, "chunk_size": 128, "num_blocks": 5,
          "batch_tkv_limit": 320, "prefix_caching": True}
REQUESTS = (RequestShape(64, 10), RequestShape(130, 5, arrival=3, abort_after=2, family=1,
                                                 shared=64),
            RequestShape(100, 3, family=1, shared=100))


def test_an_example_reads_back_equal_through_json():
    example = Example.of(VALUES, REQUESTS)
    again = example_from_dict(json.loads(json.dumps(example.to_dict())))
    assert again == example and again.key == example.key
    assert example.geometry.num_blocks == 5 and example.geometry.tkv_binds
    assert geometry_values(example.geometry) == VALUES


def test_a_geometry_is_named_by_its_values():
    assert geometry_of(VALUES).name == geometry_of(dict(VALUES)).name
    assert geometry_of(VALUES).name != geometry_of({**VALUES, "num_blocks": 6}).name


@pytest.mark.parametrize("data, words", [
    ({"format": FORMAT + 1}, f"format {FORMAT + 1}"),
    ({"format": FORMAT, "workload": [{"prompt_len": 1, "max_tokens": 1}]}, "without its geometry"),
    ({"format": FORMAT, "geometry": VALUES, "workload": []}, "without requests"),
    ({"format": FORMAT, "geometry": VALUES, "workload": [{"prompt_len": 1, "max_tokens": 1,
                                                          "colour": 2}]}, "r0:"),
    ({"format": FORMAT, "geometry": VALUES,
      "workload": [{"prompt_len": 8, "max_tokens": 3, "abort_after": 3}]}, "abort_after 3"),
    ({"format": FORMAT, "geometry": VALUES,
      "workload": [{"prompt_len": 8, "max_tokens": 3, "shared": 9}]}, "shared 9"),
    ({"format": FORMAT, "geometry": VALUES,
      "workload": [{"prompt_len": 8, "max_tokens": 3, "family": 7}]}, "family 7"),
])
def test_a_bad_example_is_refused_naming_what_is_wrong(data, words):
    with pytest.raises(ExampleError, match=words.replace("(", r"\(")):
        example_from_dict(data)


def test_a_bad_geometry_in_an_example_is_refused_as_a_geometry_file_refuses_it():
    data = Example.of(VALUES, REQUESTS).to_dict()
    data["geometry"]["max_num_seqs"] = 0
    with pytest.raises(GeometryError, match="max_num_seqs = 0 must be positive"):
        example_from_dict(data)


def test_the_scenario_has_the_shapes_the_example_says():
    scenario = Example.of(VALUES, REQUESTS).scenario(CharTokenizer())
    r0, r1, r2 = scenario.requests
    assert [len(r.prompt_token_ids) for r in scenario.requests] == [64, 130, 100]
    assert [r.max_tokens for r in scenario.requests] == [10, 5, 3]
    assert (r1.arrival_step, r1.abort_step, r2.abort_step) == (3, 5, None)
    assert scenario.aborts() == {"r1": 5}
    assert scenario.limits.max_model_len == 256 and scenario.limits.cp_chunk == 128
    # r1 and r2 share family 1's first 64 tokens; r2's whole prompt is family text.
    assert r1.prompt_token_ids[:64] == r2.prompt_token_ids[:64]
    assert r1.prompt_token_ids[64] != r2.prompt_token_ids[64]
    assert r0.prompt_token_ids[:8] != r2.prompt_token_ids[:8]


def test_a_salt_gives_new_prompts_of_the_same_shapes():
    example = Example.of(VALUES, REQUESTS)
    plain, salted = example.scenario(CharTokenizer()), example.scenario(CharTokenizer(), salt=7)
    assert [len(r.prompt_token_ids) for r in salted.requests] == [64, 130, 100]
    assert all(a.prompt_token_ids != b.prompt_token_ids
               for a, b in zip(plain.requests, salted.requests, strict=True))
    r1, r2 = salted.requests[1:]
    assert r1.prompt_token_ids[:64] == r2.prompt_token_ids[:64]  # still shared
    assert example.scenario(CharTokenizer(), salt=7).requests == salted.requests


def test_the_description_names_every_request():
    text = Example.of(VALUES, REQUESTS).describe()
    assert text.splitlines()[0].startswith("context 256, batch 2, chunk 128, pool 5 blocks")
    assert "r1: prompt 130 (its first 64 shared with text family 1), max_tokens 5, arrives at" \
           " step 3, aborted before step 5" in text
