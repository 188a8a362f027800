"""neuron: vllm-neuron on AWS Inferentia/Trainium devices (/dev/neuron<N>).

The values the engine gets are explained, against vllm-neuron's code, in harness.targets.neuron.config.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from harness.core.config import ConfigError
from harness.core.devices import DeviceScan, InventoryDevice
from harness.core.paths import REPO_ROOT
from harness.core.settings import Variable
from harness.stacks.spec import load_stack, stack_status
from harness.targets.base import (
    OFFLINE_ENV,
    PRECISION_OF_DTYPE,
    DeviceKind,
    PoolGeometry,
    TargetVariant,
    VllmTarget,
)
from harness.targets.neuron.config import (
    CORES_ENV,
    DEVICE_ENGINE_ENV,
    check_block_geometry,
    check_engine_info,
    compiled_artifacts_dir,
    inventory_env,
    model_support,
    neuron_llm_kwargs,
    settings_from_env,
)
from harness.targets.neuron.discovery import discover_neuron, host_properties, neuron_core_range
from harness.targets.neuron.sdk import describe

ROOT = REPO_ROOT
# The stack whose venv has vllm-neuron on the host's Neuron SDK (stacks/neuron.toml).
NEURON_STACK = "neuron"


def _discover(root: Path) -> DeviceScan:
    scan = discover_neuron(root)
    scan.root = root
    return scan


def _to_inventory(scan: DeviceScan) -> list[InventoryDevice]:
    out = []
    for d in scan.devices:
        cores = neuron_core_range(d.id, scan.root)
        out.append(InventoryDevice(
            id=d.id, kind="neuron", address=d.id, health="ok" if d.usable else "broken",
            present=True, detail=d.detail,
            env=((CORES_ENV, cores),) if cores else ()))
    return out


_CORE_PART = re.compile(r"([0-9]+)(?:-([0-9]+))?")


def core_count(cores: str, where: str) -> int:
    """How many NeuronCores ``cores`` (``NEURON_RT_VISIBLE_CORES``: ``"4"``, ``"0-1"``,
    ``"0,2-3"``) names; ConfigError for a malformed, reversed or overlapping range."""
    seen: set[int] = set()
    for part in cores.split(","):
        m = _CORE_PART.fullmatch(part)
        first = int(m.group(1)) if m else 0
        last = int(m.group(2)) if m and m.group(2) is not None else first
        if m is None or last < first:
            raise ConfigError(f"{where}: cores ({CORES_ENV}) {cores!r} must be like \"0-1\", \"4\" or"
                              " \"0,2-3\" (first-last, first <= last)")
        span = set(range(first, last + 1))
        if span & seen:
            raise ConfigError(f"{where}: cores ({CORES_ENV}) {cores!r} name core {min(span & seen)} twice;"
                              " list each core once")
        seen |= span
    return len(seen)


def check_device_env(env: Mapping[str, str], where: str) -> None:
    """A device's cores must be well formed and at least its engine's tensor parallel size
    (vllm-neuron shards the model over that many cores; fewer fail the start late)."""
    cores = env.get(CORES_ENV)
    if cores is None:
        return
    count = core_count(str(cores), where)
    tp = settings_from_env(env).tensor_parallel_size
    if count < tp:
        raise ConfigError(
            f"{where}: cores ({CORES_ENV}) {cores!r} are {count} NeuronCore(s), fewer than"
            f" engine.tensor_parallel_size {tp}; list at least {tp} cores or lower"
            " tensor_parallel_size")


NEURON_DEVICE = DeviceKind(
    name="neuron", label="Neuron", leased=True, address_under="dev",
    discover=_discover, to_inventory=_to_inventory,
    inventory_env=inventory_env, inventory_keys=("cores", "engine"),
    # The engine table's fields are checked by inventory_env (harness/targets/neuron/config.py).
    inventory_key_schemas={"cores": {"type": "string", "minLength": 1},
                           "engine": {"type": "object"}},
    host_properties=host_properties,
    # The node discovery lists (neuron0), or its /dev path.
    address_form="a Neuron device node, like neuron0 or /dev/neuron0",
    address_pattern=r"(?:/dev/)?(neuron\d+)",
    owned_env=(
        *((k, "the harness sets it for every engine (offline, the engine read in process)")
          for k in OFFLINE_ENV),
        ("VLLM_PLUGINS", "the harness loads vllm-neuron"),
        ("NEURON_COMPILED_ARTIFACTS", "the harness gives each compiled shape its own folder"),
        (DEVICE_ENGINE_ENV, "the harness sets it from the device's engine table: write"
         " engine = { ... }"),
    ),
    check_env=check_device_env,
    device_env_vars=(CORES_ENV,),
)


class NeuronTarget(VllmTarget):
    name = "neuron"
    order = 30
    device = NEURON_DEVICE
    # vLLM's scheduler on the device: a request joins at any step, its one block per sequence
    # in vLLM's KVCacheManager; the device sizes the pool.
    variants = (TargetVariant("neuron", "neuron", None, None, ("neuron",),
                              capabilities=("kv_ledger",)),)
    markers = {"neuron": "needs an AWS Neuron device (vllm-neuron)"}
    # One block per sequence; the platform adds the null block itself.
    geometries = {"default": PoolGeometry(None)}
    # A Neuron start compiles the model for its cores before it serves.
    start_timeouts = {"neuron": 1800.0}
    # The device computes in the dtype its inventory engine table gives (fp32 by default,
    # often bf16): a trace is judged by the precision its engine reported (trace_precision).
    backend_precisions: ClassVar[dict[str, str]] = {}
    late_env_prefixes = ("NEURON_",)
    selftest_module = "harness.targets.neuron.selftest_cases"
    distributions = (("vllm-neuron", "vllm-neuron"),)
    runtime_distributions = ("torch-neuronx",)
    variables = (
        # Read by the neuron stack files' install step (stacks/neuron.toml).
        Variable("HIL_VLLM_NEURON_GIT", "text",
                 doc="the git repository the neuron stack installs vllm-neuron from"),
        Variable(DEVICE_ENGINE_ENV, "text", internal=True,
                 doc="a Neuron device's engine table, from its inventory entry"),
    )

    @classmethod
    def trace_precision(cls, label: str, info: Mapping[str, Any]) -> str:
        return PRECISION_OF_DTYPE.get(str(info.get("model_dtype")), cls.precision(label))

    @classmethod
    def engine_info(cls) -> dict[str, Any]:
        # What a Neuron runtime in this process reads for its cores.
        return {"visible_cores": os.environ.get(CORES_ENV)}

    @classmethod
    def full_length_max_tokens(cls, max_model_len: int, prompt_len: int) -> int:
        # One block per sequence: a request holds its one block whatever its length, so the
        # pool is tight anyway; the lengths stay those run through vllm-neuron's probe
        # (tests/unit/targets/neuron/test_config.py): the prompt padded to 64 tokens plus 64 of headroom.
        padded = -(-prompt_len // 64) * 64
        return max_model_len - padded - 64

    @classmethod
    def availability_probe(cls, variant: Any) -> str | None:
        scan = discover_neuron()
        if not scan.usable:
            return scan.why_none()
        return None

    @classmethod
    def stack_probe(cls, variant: Any, stack: str) -> str | None:
        """Engines of this target run only in the neuron stack's venv (vllm-neuron + the SDK)."""
        if stack == NEURON_STACK:
            return None
        device = discover_neuron().why_none() or "Neuron device(s) present"
        return (
            f"{device}; and neuron engines run only on the {NEURON_STACK} stack (vllm-neuron on"
            f" the host's Neuron SDK), not on stack {stack!r}: on a Neuron host run"
            f" ./setup.sh --stack {NEURON_STACK}, then hil run --stacks {NEURON_STACK} -m neuron"
        )

    @classmethod
    def host_lines(cls) -> list[str]:
        # What a neuron run needs besides the device: the SDK's python and the neuron stack.
        return [f"neuron software: {describe()}",
                f"neuron stack: {stack_status(load_stack(NEURON_STACK))}"
                f" (./setup.sh --stack {NEURON_STACK})"]

    @classmethod
    def model_probe(cls, model_dir: str | Path) -> str | None:
        return model_support(model_dir)

    def _cores(self) -> str | None:
        return dict(self.cfg.extra_env).get(CORES_ENV)

    def engine_env(self) -> dict[str, str]:
        env = super().engine_env()
        env["VLLM_PLUGINS"] = "neuron"
        if self.cfg.device is not None and self._cores() is None:
            raise ConfigError(
                f"Neuron device {self.cfg.device} has no core range: list it in an inventory"
                f" with cores = \"FIRST-LAST\" (its {CORES_ENV}), so its engines stay on its cores"
            )
        # The fixtures point VLLM_CACHE_ROOT into the harness cache folder.
        cache_root = Path(os.environ.get("VLLM_CACHE_ROOT") or ROOT / ".hil-cache" / "vllm")
        env["NEURON_COMPILED_ARTIFACTS"] = str(
            compiled_artifacts_dir(cache_root, self.cfg, self.llm_kwargs()))
        return env

    def llm_kwargs(self) -> dict[str, Any]:
        kw = super().llm_kwargs()
        kw.update(neuron_llm_kwargs(self.cfg, settings_from_env(dict(self.cfg.extra_env))))
        return kw

    def check_started(self, info: dict[str, Any]) -> str | None:
        cfg = self.cfg
        dtype = settings_from_env(dict(cfg.extra_env)).dtype
        return check_engine_info(info, self._cores(), dtype) or check_block_geometry(
            info, cfg.max_model_len, cfg.max_num_seqs, cfg.num_blocks_override)


KIND = NeuronTarget
