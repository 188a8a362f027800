"""The strategies draw valid geometries and workloads, reach the edges where schedulers break,
and shrink toward the simplest example."""

from __future__ import annotations

from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from harness.explore.example import Example
from harness.explore.search import draw_geometries, simpler_geometries
from harness.explore.strategies import (
    GeometrySpace,
    WorkloadBounds,
    edges,
    geometries,
    pool_options,
    request_shapes,
    tkv_limits,
    workloads,
)
from harness.geometry.catalog import parse_geometry
from tests.unit.explore.fakes import spyre_admits

SPACE = GeometrySpace(block_size=64, pad_blocks=1, tkv_limit=True)
FAST = settings(max_examples=60, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))
G256 = parse_geometry("g", {"description": "d", "max_model_len": 256, "max_num_seqs": 2,
                            "chunk_size": 128}, "test")
BOUNDS = WorkloadBounds.of(G256, 64, spyre_admits(256))


def test_edges_are_on_and_beside_each_multiple():
    assert edges([64], 1, 200) == [63, 64, 65, 127, 128, 129, 191, 192, 193]
    assert edges([64, 128], 100, 130) == [127, 128, 129]


def test_the_pools_span_a_full_batch_fewer_requests_block_counts_and_the_device():
    pools = pool_options(SPACE, 256, 3)
    assert pools[0] == {"pool": "full-batch"} and pools[-1] == {"pool": "device"}
    assert {"pool_requests": 1} in pools and {"pool_requests": 2} in pools
    counts = [p["num_blocks"] for p in pools if "num_blocks" in p]
    # one full-length request needs 4 blocks and the pad block: 4 is too small
    assert counts == [4, 5, 6, 12, 13, 14]


def test_tkv_limits_bind_and_leave_room_for_one_full_request():
    assert tkv_limits(256, 4) == [256, 320, 512, 960]
    assert tkv_limits(256, 1) == []  # one request can never pass its own context


@FAST
@given(geometries(SPACE))
def test_every_drawn_geometry_is_valid_and_within_the_space(g):
    assert g.max_model_len in SPACE.context_lengths and 1 <= g.max_num_seqs <= 4
    assert g.chunk_size <= g.max_model_len and g.chunk_size % 64 == 0
    assert g.batch_tkv_limit is None or g.tkv_binds
    assert g.prefix_caching in (True, False)


def test_the_geometries_of_a_seed_are_distinct_repeatable_and_the_simplest_comes_first():
    drawn = draw_geometries(SPACE, seed=3, count=40)
    assert drawn == draw_geometries(SPACE, seed=3, count=40)
    assert len(set(drawn)) == len(drawn) > 10
    first = drawn[0]
    assert (first.max_model_len, first.max_num_seqs, first.chunk_size, first.pool,
            first.batch_tkv_limit, first.prefix_caching) == (128, 1, 128, "full-batch", None,
                                                              False)
    assert draw_geometries(SPACE, seed=4, count=40) != drawn


def test_the_room_of_a_prompt_is_what_the_engine_admits():
    assert BOUNDS.room[1] == 192 and BOUNDS.room[64] == 192 and BOUNDS.room[65] == 128
    assert BOUNDS.room[192] == 64 and BOUNDS.room[193] == 0
    assert BOUNDS.prompt_lengths[-1] == 192
    assert BOUNDS.max_requests == 4  # two more than the batch


@FAST
@given(workloads(BOUNDS))
def test_every_drawn_workload_fits_its_geometry(requests):
    assert 1 <= len(requests) <= BOUNDS.max_requests
    for r in requests:
        assert r.problem() is None
        assert 1 <= r.max_tokens <= BOUNDS.room[r.prompt_len]
        assert spyre_admits(256)(r.prompt_len, r.max_tokens)
    Example.of(G256, requests)  # and makes an example


def test_the_edges_are_reached():
    on_edge = find(request_shapes(BOUNDS), lambda r: r.prompt_len == 129,
                   settings=settings(database=None, max_examples=2000))
    assert on_edge.prompt_len == 129
    ends = find(request_shapes(BOUNDS), lambda r: r.prompt_len + r.max_tokens == 129,
                settings=settings(database=None, max_examples=2000))
    assert ends.prompt_len + ends.max_tokens == 129
    shared = find(request_shapes(BOUNDS), lambda r: 0 < r.shared == 64,
                  settings=settings(database=None, max_examples=2000))
    assert shared.shared == 64


def test_a_workload_shrinks_to_one_request_of_one_token():
    smallest = find(workloads(BOUNDS), lambda rs: True,
                    settings=settings(database=None, max_examples=50))
    assert len(smallest) == 1
    r = smallest[0]
    assert (r.prompt_len, r.max_tokens, r.arrival, r.abort_after, r.shared) == (1, 1, 0, None, 0)


@FAST
@given(st.data())
def test_every_simpler_geometry_is_valid_and_simpler(data):
    g = data.draw(geometries(SPACE))
    values = Example.of(g, ()).values
    for simpler in simpler_geometries(values):
        assert simpler != values
        assert simpler["max_model_len"] <= values["max_model_len"]
        assert simpler["max_num_seqs"] <= values["max_num_seqs"]


def test_simpler_geometries_drop_the_tkv_limit_first():
    values = {"max_model_len": 256, "max_num_seqs": 2, "chunk_size": 64, "num_blocks": 6,
              "batch_tkv_limit": 320, "prefix_caching": True}
    first = next(simpler_geometries(values))
    assert "batch_tkv_limit" not in first and first["num_blocks"] == 6
    steps = list(simpler_geometries(values))
    assert {"max_model_len": 256, "max_num_seqs": 2, "chunk_size": 64, "pool": "full-batch",
            "batch_tkv_limit": 320, "prefix_caching": True} in steps
    assert {**values, "max_num_seqs": 1} in steps
    assert {**values, "max_model_len": 128} in steps


def test_tensor_parallel_sizes_are_drawn_only_where_asked_and_shrink_to_one_rank():
    from dataclasses import replace

    assert {g.tensor_parallel_size for g in draw_geometries(SPACE, 0, 40)} == {1}
    tp = replace(SPACE, tensor_parallel=(1, 2))
    assert {g.tensor_parallel_size for g in draw_geometries(tp, 0, 40)} == {1, 2}
    simplest = find(geometries(tp), lambda g: True, settings=FAST)
    assert simplest.tensor_parallel_size == 1


def _space_of(variant_id: str) -> GeometrySpace:
    from harness.explore.runner import ExampleRunner
    from harness.targets import kind

    variant = next(v for k in ("spyre", "vllm-cpu") for v in kind(k).variants if v.id == variant_id)
    runner = ExampleRunner.__new__(ExampleRunner)  # the space needs no session
    runner.variant, runner.kind, runner.stack = variant, kind(variant.target), "default"
    runner.pool_geometry = runner.kind.stack_geometry(runner.kind.sized_pool_geometry, "default")
    runner.tensor_parallel = (1,)
    return runner.space()


@FAST
@given(st.data())
def test_a_card_is_searched_in_the_shapes_it_compiles_the_cpu_in_all(data):
    card = _space_of("spyre-sendnn-cp")
    assert (card.context_lengths, card.batch_sizes) == ((512,), (4,))
    g = data.draw(geometries(card))
    assert (g.max_model_len, g.max_num_seqs) == (512, 4)
    cpu = _space_of("spyre-eager-cp")
    assert cpu.context_lengths == SPACE.context_lengths and cpu.batch_sizes is None
