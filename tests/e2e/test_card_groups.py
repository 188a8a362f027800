"""The emulated card host with four cards: tensor-parallel engines on card groups, and the
plugin's registry entry a card engine runs with (a lab's registry file). The card host itself
(tools/card-host/run.sh) and its helpers are test_card_host.py's."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from harness.engine.device_ledger import ledger_problems
from tests.e2e.test_card_host import _one_failure, card_host

pytestmark = [pytest.mark.e2e, pytest.mark.card_host, pytest.mark.timeout(1500)]


def test_card_groups_and_a_lab_registry_entry_on_a_four_card_host(tmp_path: Path) -> None:
    # A 4-card host whose inventory declares no group, a lab registry with an entry for
    # tiny-llama at TP 1, context 512, batch 4, and two engines on two workers, each in a shape
    # a card compiles: `card` on one card under that entry (40 blocks, where the plugin would
    # size 36: a full batch of four full-length requests and the pad block, rounded up to a
    # multiple of the batch), TP 4 on a group formed of the four free cards (all or none: it
    # waits for the other worker's card, and that worker, holding a card, never waits for the
    # group). Each rank's runtime opens its own card; the report names the entry where it
    # applied. (A declared group: test_card_host.py's verification test.)
    registry = tmp_path / "lab_model_configs.yaml"
    entry = lab_registry(registry, "tiny-llama", blocks=40, tkv_limit=2048)
    rc, out, results, events = card_host(
        tmp_path / "run", "-k", "test_full_batch_in_geometry and tiny-llama and cp",
        "--geometry", "card,tp4", "-n", "2",
        host_env={"HIL_CARD_HOST_CARDS": "4", "SENDNN_INFERENCE_MODEL_CONFIG_FILE": str(registry)})
    assert rc == 0, out[-4000:]
    names = [f"test_full_batch_in_geometry[tiny-llama-spyre-sendnn-cp-{g}]" for g in ("card", "tp4")]
    assert sorted(results) == names, out[-3000:]
    assert all(o == "passed" for o, _ in results.values()), results
    starts = sorted((e.get("cards") or [e["device"]] for e in events if e["event"] == "start"),
                    key=len)
    assert [len(c) for c in starts] == [1, 4], events
    addresses = {f"card{i}": f"0000:{0x3b + i:02x}:00.0" for i in range(4)}
    assert starts[1] == ["card0", "card1", "card2", "card3"]  # a formed group: address order
    assert ledger_problems(events) == []  # no two engines live on one card at once
    for log in (tmp_path / "run" / "reports" / "engine-logs").glob("*spyre-sendnn-cp-*.log"):
        text = log.read_text(errors="replace")
        ranks = dict(re.findall(r"Worker_TP(\d+) .*Opened: SEN:VFIO:(\S+)", text))
        if ranks:
            assert ranks == {str(i): addresses[c] for i, c in enumerate(starts[1])}, ranks
    params = {n: {p["name"]: p["value"] for p in r.get("parameters", [])} for r in
              (json.loads(f.read_text()) for f in
               (tmp_path / "run" / "reports" / "allure-results").glob("*-result.json"))
              for n in [r.get("name", "")]}
    entries = sorted(p.get("registry entry", "-").strip("'") for p in params.values())
    assert entries == ["-", f"{entry} (TP 1, 40 blocks, TKV limit 2048)"], params


def lab_registry(path: Path, model: str, blocks: int, tkv_limit: int) -> str:
    """A lab's registry file (sendnn-inference's model_configs.yaml schema) with one entry for
    the tiny ``model``'s architecture, from its build spec: served at TP 1, context 512, batch 4
    (the `card` geometry) with ``blocks`` KV blocks and a batch TKV limit. Returns its name."""
    from fixtures.model_specs import MODEL_SPECS

    spec = MODEL_SPECS[model]
    name = f"lab/{model}"
    arch = {"model_type": spec.architecture,
            **{k: getattr(spec, k) for k in ("num_hidden_layers", "hidden_size",
                                             "num_attention_heads", "num_key_value_heads",
                                             "max_position_embeddings")}}
    entry = {"architecture": arch, "continuous_batching_configs": [
        {"tp_size": 1, "max_model_len": 512, "max_num_seqs": 4,
         "device_config": {"num_gpu_blocks_override": blocks,
                           "env_vars": {"VLLM_DT_MAX_BATCH_TKV_LIMIT": tkv_limit}}}]}
    path.write_text(json.dumps({"models": {name: entry}}, indent=1))  # JSON is YAML
    return name


def test_a_card_engine_off_its_registry_entry_is_refused(tmp_path: Path) -> None:
    # The entry above, and a model configurator that applies four blocks fewer than it declares
    # (the plugin's own default then: a configurator that drops the entry's block count).
    registry = tmp_path / "lab_model_configs.yaml"
    entry = lab_registry(registry, "tiny-llama", blocks=40, tkv_limit=2048)
    rc, out, results, _ = card_host(
        tmp_path / "off", "-k", "test_full_batch_in_geometry and tiny-llama and cp-card",
        "--geometry", "card", "--inject-fault", "registry-blocks-off:by=-4",
        host_env={"SENDNN_INFERENCE_MODEL_CONFIG_FILE": str(registry)})
    assert rc == 1, out[-4000:]
    text = _one_failure(results, out)
    assert (f"the plugin's registry entry '{entry}' ({registry}) declares num_gpu_blocks_override"
            " 40, but the engine's KV cache has 36 blocks") in text, text[:3000]
