"""The kind registry: each kind declares itself once and the harness asks it."""

from __future__ import annotations

import importlib
import math
import pkgutil
import re
from pathlib import Path

import pytest

from harness import targets
from harness.cli import nightly_selection
from harness.core.config import ConfigError, EngineConfig, WarmupShape
from harness.core.devices import InventoryDevice
from harness.lab.inventory import load_inventory
from harness.reference.cache import ReferenceCache
from harness.reference.runner import ReferenceRunner
from harness.targets.base import VllmTarget
from harness.targets.runner import EngineRunner, Runner
from harness.targets.variants import VARIANTS


def test_registry_lists_each_kind_once_in_order() -> None:
    """Every package under harness/targets whose kind module sets KIND, and every kind an
    entry point declares, once, in (order, name); the other lists follow from them."""
    packages = {m.KIND for info in pkgutil.iter_modules(targets.__path__) if info.ispkg
                for m in [importlib.import_module(f"harness.targets.{info.name}.kind")]
                if getattr(m, "KIND", None) is not None}
    declared = set(packages) | set(targets._entry_point_kinds())
    kinds = list(targets.KINDS.values())
    assert set(kinds) == declared and len(kinds) == len(declared)
    assert kinds == sorted(kinds, key=lambda k: (k.order, k.name))
    assert all(targets.KINDS[k.name] is k for k in kinds)
    assert list(targets.engine_kinds()) == [k.name for k in kinds if issubclass(k, VllmTarget)]
    assert list(targets.device_kinds()) == list(dict.fromkeys(k.device.name for k in kinds))
    assert list(VARIANTS) == [v.id for k in kinds for v in k.variants]
    assert VARIANTS["spyre-eager-cb"].markers == ("cpu", "cb")
    assert VARIANTS["spyre-sendnn-cp"].platform_marker == "spyre"


def test_unknown_target_and_mode_name_the_known_ones() -> None:
    unknown = "not-a-kind"
    assert unknown not in targets.KINDS
    known = ", ".join(targets.engine_kinds())
    with pytest.raises(ConfigError, match=re.escape(f"unknown target '{unknown}'; known targets: {known}")):
        EngineConfig(target=unknown, model="m", max_model_len=256, max_num_seqs=2)
    for reference in set(targets.KINDS) - set(targets.engine_kinds()):
        with pytest.raises(ConfigError, match="runs no engine"):
            EngineConfig(target=reference, model="m", max_model_len=256, max_num_seqs=2)
    with pytest.raises(ConfigError, match="unknown spyre mode 'xb'; known modes: sb, cb, cp"):
        EngineConfig(target="spyre", model="m", max_model_len=256, max_num_seqs=2,
                     mode="xb", backend="eager")
    with pytest.raises(ConfigError, match="takes no mode"):
        EngineConfig(target="vllm-cpu", model="m", max_model_len=256, max_num_seqs=2, mode="cb")


def test_variant_id_is_carried_not_parsed() -> None:
    cfg = EngineConfig(target="spyre", model="m", max_model_len=256, max_num_seqs=2, mode="sb",
                       backend="eager", warmup=WarmupShape(64, 20, 2), stack="legacy-spyre-0.4")
    assert cfg.label == "legacy-spyre-0.4:spyre-eager-sb"
    assert cfg.variant_id == "spyre-eager-sb"


def test_pool_geometry_presets() -> None:
    cpu = targets.kind("vllm-cpu")
    assert cpu.geometry("paged").engine_overrides(256, 4) == {
        "block_size": 16, "num_blocks_override": 4 * 16 + 1}
    assert cpu.geometry("one-block-per-sequence").engine_overrides(256, 4) == {
        "block_size": 256, "num_blocks_override": 5}
    # the paged geometry's blocks as each stack's vLLM takes them
    assert cpu.stack_geometry("paged", "default").block_size == 16  # vLLM 0.28
    assert cpu.stack_geometry("paged", "spyre-1.10").block_size == 16  # vLLM 0.17
    assert cpu.stack_geometry("paged", "canary").block_size == 32  # vLLM 0.32
    assert cpu.stack_geometry("one-block-per-sequence", "canary").block_size is None
    assert targets.kind("spyre").geometry().engine_overrides(256, 4) == {}
    assert targets.kind("spyre").geometry().block_tokens(256) == 64
    with pytest.raises(KeyError, match="vllm-cpu has no pool geometry 'huge'; known: paged"):
        cpu.geometry("huge")


def test_neuron_engine_gets_one_block_per_sequence() -> None:
    cfg = EngineConfig(target="neuron", model="m", max_model_len=256, max_num_seqs=2)
    assert targets.target_for(cfg).llm_kwargs()["block_size"] == 256


def test_nightly_selection_from_the_devices_kinds_serve(tmp_path: Path) -> None:
    inv = tmp_path / "inv.toml"
    inv.write_text('[[device]]\nid = "card0"\nkind = "spyre"\nfeatures = ["cb"]\n'
                   '[[device]]\nid = "stand-in"\nkind = "spyre"\nbackend = "eager"\n')
    devices = load_inventory(inv, root=tmp_path).devices
    assert nightly_selection(devices) == "nightly and (cpu or spyre)"
    assert nightly_selection(devices[1:]) == "nightly and (cpu)"
    neuron = InventoryDevice(id="neuron0", kind="neuron")
    assert nightly_selection([neuron]) == "nightly and (cpu or neuron)"


def test_inventory_checks_against_the_kinds(tmp_path: Path) -> None:
    inv = tmp_path / "inv.toml"
    inv.write_text('[[device]]\nid = "n"\nkind = "neuron"\naddress = "/dev/neuron3"\n')
    (dev,) = load_inventory(inv, root=tmp_path).devices
    assert not dev.present and str(tmp_path / "dev" / "neuron3") in dev.detail
    assert dev.leased


def test_reference_and_engines_answer_the_same_verb(tmp_path: Path) -> None:
    ref = ReferenceRunner(tmp_path, "hash", ReferenceCache(tmp_path / "c"), top_k=3)
    cfg = EngineConfig(target="vllm-cpu", model="m", max_model_len=256, max_num_seqs=2)
    calls = []

    class Session:
        def generate(self, c: EngineConfig, scenario: object) -> str:
            calls.append((c, scenario))
            return "trace"

    eng = EngineRunner(Session(), cfg)
    assert isinstance(ref, Runner) and isinstance(eng, Runner)
    assert eng.generate("scenario") == "trace" and calls == [(cfg, "scenario")]  # type: ignore[arg-type,comparison-overlap]
    assert ref.label == "cpu-ref" and eng.label == "vllm-cpu"


def test_each_engine_kind_owns_its_environment() -> None:
    envs = {}
    for name, kind in targets.engine_kinds().items():
        assert issubclass(kind, VllmTarget)
        cfg = VARIANTS[kind.variants[0].id].engine_config(
            "m", type("L", (), {"max_model_len": 256, "max_num_seqs": 2, "sb_warmup": (64, 20, 2),
                                "cp_chunk": 64})(), stack="spyre-1.10")
        envs[name] = kind(cfg).engine_env()
    assert envs["vllm-cpu"]["VLLM_PLUGINS"] == ""
    assert envs["spyre"]["VLLM_PLUGINS"] == "spyre"  # vllm-spyre 1.x on the spyre-1.10 stack
    assert envs["spyre"]["VLLM_SPYRE_USE_CB"] == "0"  # the first spyre variant is sb
    limits = type("L", (), {"max_model_len": 256, "max_num_seqs": 2, "sb_warmup": None,
                            "cp_chunk": 64})()
    cp = targets.kind("spyre")(VARIANTS["spyre-eager-pc"].engine_config("m", limits))
    env, kwargs = cp.engine_env(), cp.llm_kwargs()  # sendnn-inference 2.x on the default stack
    assert env["VLLM_PLUGINS"] == "sendnn_inference"
    assert env["SENDNN_INFERENCE_DYNAMO_BACKEND"] == "eager"
    assert not any(k.startswith("VLLM_SPYRE_") for k in env)
    assert kwargs["enable_prefix_caching"] is True and kwargs["max_num_batched_tokens"] == 64
    assert envs["neuron"]["VLLM_PLUGINS"] == "neuron"
    assert all(e["HF_HUB_OFFLINE"] == "1" for e in envs.values())


def test_kinds_declare_precision_late_variables_and_pool_checks() -> None:
    """What checks and the fork server used to read from kind names in strings."""
    assert targets.logprob_policy("vllm-cpu").backend == "vllm-cpu"
    assert targets.logprob_policy("vllm-cpu").tol == 0.01
    assert targets.logprob_policy("spyre-eager-cb").backend == "eager"
    assert targets.logprob_policy("spyre-eager-cb").tol == 0.01
    assert targets.logprob_policy("default:spyre-sendnn-cp").tol == 0.5
    assert targets.logprob_policy("vllm-cpu-bf16", tol_card=0.9).tol == 0.9
    assert targets.logprob_policy("spyre-eager-cb", tol_fp32=0.2, tol_card=0.9).tol == 0.2
    prefixes = targets.late_env_prefixes()
    assert {"SENDNN_INFERENCE_", "VLLM_SPYRE_", "AIU_", "NEURON_"} <= set(prefixes)
    assert targets.kind("spyre").refuses_small_pool
    assert not targets.kind("vllm-cpu").refuses_small_pool


def test_spyre_join_reservation_follows_the_runners_worst_case() -> None:
    reserve = targets.kind("spyre").join_reservation
    # joining at its own prompt length: every token up to max_tokens, the last never fed
    assert reserve(64, 64, 192, 64) == 4  # 64 + 191 = 255 tokens
    assert reserve(64, 64, 128, 64) == 3  # 191 tokens
    assert reserve(64, 64, 129, 64) == 3  # 192 tokens: still 3 blocks
    assert reserve(64, 64, 130, 64) == 4
    # joining a batch whose tkv is a block past its prompt: the padding block is not reserved
    assert reserve(128, 60, 100, 64) == math.ceil(227 / 64) - 1
    assert targets.kind("vllm-cpu").join_reservation(64, 64, 192, 16) is None
