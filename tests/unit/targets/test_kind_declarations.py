"""What the shared modules used to hard-code about a kind, each declared by the kind and merged
by the registry: inventory keys and backends (the inventory schema), the stack's distributions
(the report's versions, the shards' agreement), the device variables the report names, the
stack's capacity refusal, the plugin's own ledger sources, the kind's HIL_* variables and the
meaning of a marker several kinds carry."""

from __future__ import annotations

import pytest

from harness import targets
from harness.core.settings import BY_VARIABLE, DECLARED_BY
from harness.core.trace import SOURCE_VLLM_SCHEDULER
from harness.lab.schemas import SchemaError, check, inventory_schema
from harness.lab_merge.merge import SAME_STACK
from harness.report.categories import classify
from harness.report.labels import DEVICE_ENV_VARS, device_instance
from harness.report.run_config import VERSIONS
from harness.targets.base import DeviceKind, TargetVariant, VllmTarget
from harness.targets.variants import VARIANTS

TPU_DEVICE = DeviceKind(
    "tpu", "TPU", leased=True, backends=("xla", "eager"), inventory_keys=("chips", "topology"),
    inventory_key_schemas={"chips": {"type": "integer", "minimum": 1}},
    inventory_env=lambda e, where: {}, device_env_vars=("TPU_VISIBLE_CHIPS", "TPU_NAME"),
)


class TpuTarget(VllmTarget):
    """A kind no shared module names: everything below reaches them through the registry."""

    name = "tpu"
    order = 40
    device = TPU_DEVICE
    variants = (TargetVariant("tpu", "tpu", None, None, ("tpu", "cpu")),)
    markers = {"tpu": "needs a TPU", "cpu": "runs on this machine's CPU (tpu emulated)"}
    capacity_refusal = "Insufficient HBM for the KV cache"
    ledger_sources = ("tpu-runner",)
    distributions = (("vllm-tpu", "vllm-tpu"), ("vllm-spyre", "vllm-spyre"))


@pytest.fixture
def with_tpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(targets.KINDS, "tpu", TpuTarget)


def _entry(**fields: object) -> dict[str, object]:
    return {"device": [{"id": "t0", "kind": "tpu", **fields}]}


def test_a_new_kind_reaches_the_merged_declarations(with_tpu: None) -> None:
    assert targets.capacity_refusals()[-1] == "Insufficient HBM for the KV cache"
    assert targets.ledger_sources()["tpu-runner"] == "tpu"
    # Each distribution once, in kind order.
    assert targets.stack_distributions()[-1] == ("vllm-tpu", "vllm-tpu")
    assert len(set(targets.stack_distributions())) == len(targets.stack_distributions())
    assert targets.device_env_vars()[-2:] == ("TPU_VISIBLE_CHIPS", "TPU_NAME")
    assert targets.kind_markers()["cpu"].endswith(", tpu emulated)")


def test_a_new_kinds_inventory_keys_and_backends_join_the_schema(with_tpu: None) -> None:
    fields = inventory_schema()["properties"]["device"]["items"]["properties"]
    assert list(fields)[-3:] == ["chips", "topology", "env"]
    assert fields["chips"] == {"type": "integer", "minimum": 1}
    assert fields["topology"] == {}  # no fragment: any value, for the kind's inventory_env
    assert fields["backend"]["enum"][-1] == "xla"
    check(_entry(chips=4, topology="2x2", backend="xla"), inventory_schema(), "inv.toml",
          {"device": "id"})
    with pytest.raises(SchemaError, match=r"chips 0: 0 is less than the minimum of 1"):
        check(_entry(chips=0), inventory_schema(), "inv.toml", {"device": "id"})


def test_the_inventory_schema_is_the_kinds_declarations() -> None:
    fields = inventory_schema()["properties"]["device"]["items"]["properties"]
    assert list(fields) == ["id", "kind", "backend", "address", "features", "health",
                            *(k for d in targets.device_kinds().values() for k in d.inventory_keys),
                            "env"]
    assert fields["backend"]["enum"] == list(dict.fromkeys(
        b for d in targets.device_kinds().values() for b in d.backends))
    for d in targets.device_kinds().values():
        for key, fragment in d.inventory_key_schemas.items():
            assert key in d.inventory_keys, f"{d.name}: schema for undeclared key {key}"
            assert fields[key] == fragment


def test_the_report_and_the_merge_name_the_kinds_distributions() -> None:
    for label, dist in targets.stack_distributions():
        assert (label, dist) in VERSIONS and label in SAME_STACK


def test_the_report_names_a_device_by_the_kinds_variables() -> None:
    assert DEVICE_ENV_VARS == targets.device_env_vars()
    assert DEVICE_ENV_VARS, "no kind declares a device variable: the label is untested"
    variant = VARIANTS["vllm-cpu"]

    class Config:
        def __init__(self, name: str) -> None:
            self.extra_env = ((name, "dev-9"),)

    for name in DEVICE_ENV_VARS:
        assert device_instance(variant, {}, Config(name), env={}) == f"{name}=dev-9"


def test_each_kinds_capacity_refusal_is_filed_as_capacity() -> None:
    refusals = [k.capacity_refusal for k in targets.KINDS.values() if k.capacity_refusal]
    assert refusals, "no kind declares a capacity refusal: the category is untested"
    assert tuple(refusals) == targets.capacity_refusals()
    for text in refusals:
        first_line = (f"harness.core.errors.EngineStartError: engine x failed to start with model"
                      f" /m: ValueError: {text} (4) is not enough")
        assert classify("broken", first_line) == "capacity"


def test_ledger_sources_are_each_kinds_own() -> None:
    sources = targets.ledger_sources()
    assert SOURCE_VLLM_SCHEDULER not in sources
    for k in targets.KINDS.values():
        if k.ledger_sources:
            assert k.probe_modules, f"{k.name} declares ledgers but no module reads them"
    total = sum(len(k.ledger_sources) for k in targets.KINDS.values())
    assert len(sources) == total, "two kinds declare one ledger source"


def test_the_kinds_variables_are_registered_with_the_settings_layer() -> None:
    for k in targets.KINDS.values():
        for var in k.variables:
            assert BY_VARIABLE[var.name] is var
            assert DECLARED_BY[var.name] == f"target kind {k.name}"


def test_a_marker_several_kinds_carry_lists_what_of_each_carries_it() -> None:
    merge = targets._merged_marker_doc
    assert merge("runs here (a)", "runs here (b)") == "runs here (a, b)"
    assert merge("runs here (a, b)", "runs here (b, c)") == "runs here (a, b, c)"
    assert merge("runs here (a)", "something else (b)") == "runs here (a)"
    assert merge("runs here", "runs here (b)") == "runs here"
    carriers = targets.kind_markers()["cpu"]
    for k in targets.KINDS.values():
        doc = k.markers.get("cpu")
        if doc:
            assert doc.rpartition("(")[2].rstrip(")") in carriers
