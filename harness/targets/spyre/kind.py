"""spyre: the real vllm-spyre plugin; eager on the CPU, sendnn on a card.

The CPU-mode runs (eager backend) carry ``cpu``, as vllm-spyre's own suite does,
so ``-m cpu`` is the full run on a machine without cards; the card runs
(sendnn backend) carry ``spyre``. Each also carries its mode (sb, cb, cp).
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.core.comparison import NearTiePolicy
from harness.core.config import ConfigError, EngineConfig
from harness.core.devices import DeviceScan, InventoryDevice, device_root
from harness.core.ports import AVOID_ENV, BIND_PORTS_ENV
from harness.in_engine.kind_modules import BATCH_ORDER
from harness.scenario.prompts import EngineLimits
from harness.targets.base import (
    OFFLINE_ENV,
    DeviceKind,
    NearTieTolerance,
    PoolGeometry,
    TargetVariant,
    VllmTarget,
)
from harness.targets.declarations import cpu_tensor_parallel_problem
from harness.targets.spyre import card_shape, padding
from harness.targets.spyre.card import (
    ALLOW_EMULATED_ENV,
    DEVICE_DTYPES,
    NEAR_TIE_TOL_SENDNN,
    SENDNN_START_TIMEOUT,
    card_env,
    engine_card_info,
    inherited_card_env,
    near_tie_policy,
    prepare_card_start,
    torch_sendnn_status,
    verify_card_engine,
)
from harness.targets.spyre.card_report import (
    card_stack_lines,
    card_stack_problem,
    engine_python_sendnn,
)
from harness.targets.spyre.discovery import discover_spyre, host_properties
from harness.targets.spyre.generations import (
    GENERATIONS,
    SENDNN_INFERENCE,
    VLLM_SPYRE,
    PluginGeneration,
    for_stack,
    platform_problem,
)
from harness.targets.spyre.ledger_sources import LEDGER_SOURCES
from harness.targets.spyre.registry_entry import (
    applied_entry,
    entry_geometry,
    entry_label,
    entry_problem,
)

BLOCK_SIZE = 64  # vllm-spyre's fixed KV block size (platform._block_size)
MODES = ("sb", "cb", "cp", "pc", "np")  # each generation has some of them (generations.py)
CHUNKED_MODES = ("cp", "pc", "np")
# What each mode can do (harness.targets.declarations.CAPABILITIES). Static batching runs one
# warmed-up batch shape, with no KV blocks to read per step; continuous batching (1.x) reserves
# a request's worst case when it joins, and its scheduler's pool never runs out by itself;
# chunked prefill pauses on sendnn-inference 2.x (``capability_problem``: not on 1.x).
MODE_CAPABILITIES = {
    "sb": (),
    "cb": ("kv_ledger", "refuses_small_pool", "join_reservation", "forced_preemption",
           "holds_back_on_blocks"),
    "cp": ("kv_ledger", "refuses_small_pool", "pausing", "holds_back_on_blocks"),
    "pc": ("kv_ledger", "refuses_small_pool", "pausing", "holds_back_on_blocks",
           "prefix_caching"),
    "np": ("kv_ledger", "refuses_small_pool", "holds_back_on_blocks"),
}
# Pausing off is a lab's choice, not the default users run: a control of the suites that run
# pausing's controls, not a copy of every suite (opt-in: where --target names it).
SWITCHED_OFF = {"np": "pausing"}
BACKENDS = ("sendnn", "eager")  # the inventory's default first: a card


def _discover(root: Path) -> DeviceScan:
    return discover_spyre(root)


def _to_inventory(scan: DeviceScan) -> list[InventoryDevice]:
    return [
        InventoryDevice(
            id=f"spyre{i}", kind="spyre", backend="sendnn", address=d.id,
            health="ok" if d.usable else "broken", env=(("AIU_WORLD_RANK_0", d.id),),
            present=True, detail=d.detail,
        )
        for i, d in enumerate(scan.devices)
    ]


# A card's PCI address as sysfs names it (discovery lists these): domain:bus:device.function.
PCI_ADDRESS = r"([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])"
PCI_FORM = "a PCI address domain:bus:device.function in hex, like 0000:1a:00.0"
# The plugin variables the harness sets per engine from the test's target variant.
_VARIANT_KEYS = ("DYNAMO_BACKEND", "USE_CB", "USE_CHUNKED_PREFILL", "PAUSING_ENABLED",
                 "WARMUP_PROMPT_LENS", "WARMUP_NEW_TOKENS", "WARMUP_BATCH_SIZES",
                 "SIMPLE_COMPILE_BACKEND")
OWNED_ENV = (
    *((k, "the harness sets it for every engine (offline, the engine read in process)")
      for k in OFFLINE_ENV),
    ("VLLM_PLUGINS", "the harness loads the plugin of the stack's generation"),
    ("HIL_CARD_ADDRESS", "the harness sets it from the device's address, and the on-card check"
     " compares the card the engine opened with it: give the card as address = \"...\""),
    ("MASTER_ADDR", "the harness gives each engine its own loopback rendezvous"),
    ("MASTER_PORT", "each engine picks a free port as it starts (harness/core/ports.py)"),
    (BIND_PORTS_ENV, "the harness names the variables each engine picks a port for"),
    (AVOID_ENV, "the engine pool names the ports an earlier start found taken"),
    *((g.var(k), "the harness sets it from the test's target variant (backend, mode, warmup)")
      for g in GENERATIONS for k in _VARIANT_KEYS),
)

SPYRE_DEVICE = DeviceKind(
    name="spyre", label="Spyre", leased=True, backends=BACKENDS,
    address_under="sys/bus/pci/devices", discover=_discover, to_inventory=_to_inventory,
    host_properties=host_properties,
    address_form=PCI_FORM, address_pattern=PCI_ADDRESS, address_env="AIU_WORLD_RANK_0",
    group_env_prefixes=("AIU_WORLD_",),  # AIU_WORLD_SIZE and AIU_WORLD_RANK_<rank>: card.py
    owned_env=OWNED_ENV,
    # Read in this order by the report: the card a Kubernetes device plugin gave the pod, then
    # the card the runtime opens.
    device_env_vars=("PCIDEVICE_IBM_COM_AIU_PF", "AIU_WORLD_RANK_0"),
)


class SpyreTarget(VllmTarget):
    name = "spyre"
    order = 20
    device = SPYRE_DEVICE
    modes = MODES
    mode_help = ("sb = static batching, cb = continuous batching, cp = chunked prefill,"
                 " pc = chunked prefill with prefix caching, np = chunked prefill with"
                 " pausing off (pc and np: sendnn-inference 2.x)")
    backends = ("eager", "sendnn")
    backend_help = "eager runs on the CPU, sendnn on a card"
    variants = tuple(
        TargetVariant(f"spyre-{backend}-{mode}", "spyre", backend, mode, (marker, mode),
                      chunked=mode in CHUNKED_MODES, capabilities=MODE_CAPABILITIES[mode],
                      switches_off=SWITCHED_OFF.get(mode))
        for backend, marker in (("eager", "cpu"), ("sendnn", "spyre"))
        for mode in MODES
    )
    markers = {
        "cpu": "runs on this machine's CPU (spyre eager)",
        "spyre": "needs a Spyre card (vllm-spyre, sendnn backend)",
        "sb": "vllm-spyre static batching",
        "cb": "vllm-spyre continuous batching",
        "cp": "vllm-spyre continuous batching with chunked prefill",
        "pc": "sendnn-inference chunked prefill with prefix caching on",
        "np": "sendnn-inference chunked prefill with pausing off (runs where named)",
    }
    plugin_preload = {gen.module: gen.preload for gen in GENERATIONS}
    fault_modules = ("harness.targets.spyre.faults", "harness.targets.spyre.faults_2x",
                     "harness.targets.spyre.faults_tkv_prefix")
    probe_modules = ("harness.targets.spyre.ledger",)
    selftest_module = "harness.targets.spyre.selftest_cases"
    # sendnn-inference's runner publishes its batch order to the row-corruption faults.
    runner_hooks = {BATCH_ORDER: "harness.targets.spyre.batch_order:publish_batch_order"}
    commands = {"registry": "harness.targets.spyre.registry:add_registry_parser"}
    ledger_sources = LEDGER_SOURCES
    distributions = (("vllm-spyre", "vllm-spyre"), ("sendnn-inference", "sendnn-inference"))
    runtime_distributions = ("torch-sendnn",)
    # The platform fixes 64-token blocks and keeps block 0 as the pad block.
    geometries = {"default": PoolGeometry(BLOCK_SIZE, pad_blocks=1, fixed=True)}
    # The Spyre compiler's batch size x TKV limit; the plugin reads it from the environment
    # (unset, it makes it max_model_len x max_num_seqs).
    batch_tkv_limit_env = "VLLM_DT_MAX_BATCH_TKV_LIMIT"
    start_timeouts = {"sendnn": SENDNN_START_TIMEOUT}
    near_tie_tolerances = (
        NearTieTolerance("sendnn", NEAR_TIE_TOL_SENDNN,
                         "the card computes fp16 against the fp32 reference"),
    )
    # What computes below the reference's fp32 (eager computes fp32 on the CPU).
    backend_precisions = {b: dtype for b, dtype in DEVICE_DTYPES.items() if dtype != "fp32"}
    # The card runtime's, and each plugin generation's own (read when the engine is built).
    late_env_prefixes = ("AIU_", "SPYRE_", "FLEX_", "DT_", *(g.env_prefix for g in GENERATIONS))
    # The card (group) an engine opens and its compile cache (harness.targets.spyre.card), and
    # the device plugin's card variable: each engine's own, read when its runtime opens; and the
    # runtime's shape variables (VLLM_DT_*: the batch TKV limit a test or a registry entry sets),
    # read by the plugin when it configures an engine (platform.check_and_update_config).
    per_engine_env_prefixes = ("AIU_WORLD_", "TORCH_SENDNN_CACHE_DIR", "PCIDEVICE_IBM_COM_AIU_",
                               "VLLM_DT_")
    refuses_small_pool = True  # the platform checks the pool it is given at start
    # vllm-spyre's refusal of it; a plain ValueError, so the report files it by this text.
    capacity_refusal = "Number of pages available on Spyre"

    @classmethod
    def capability_problem(cls, variant: Any, capability: str, stack: str) -> str | None:
        """Pausing is a sendnn-inference 2.x scheduler's (``pausing`` of the generation); holding
        back on blocks the modes' of ``holds_back_on_blocks`` of the generation."""
        gen = for_stack(stack)
        if capability == "holds_back_on_blocks":
            if gen is None or variant.mode in gen.holds_back_on_blocks:
                return None
            return (f"{variant.id} on stack {stack} runs {gen.name}, whose {variant.mode}"
                    f" scheduler admits without reserving the blocks a request may need"
                    f" (holds_back_on_blocks, harness/targets/spyre/generations.py)")
        if capability != "pausing" or (gen is not None and gen.pausing):
            return None
        runs = gen.name if gen is not None else "no Spyre plugin"
        return (f"{variant.id} on stack {stack} runs {runs}, whose scheduler never pauses a"
                f" decoding request (pausing, harness/targets/spyre/generations.py)")

    @classmethod
    def tensor_parallel_problem(cls, variant: Any, ranks: int, stack: str) -> str | None:
        """The CPU backend runs tensor-parallel ranks where the machine has a core per rank
        (the plugin's own suite runs TP on its CPU path); a card engine holds one card, and an
        engine of ``ranks`` cards needs a card group leased at once, which this harness does
        not lease."""
        if variant.backend == "sendnn":
            if for_stack(stack) is SENDNN_INFERENCE:
                return None  # a group of cards, leased together (harness.lab.leases)
            return (f"{variant.id} on stack {stack}: a TP {ranks} engine on a card group runs"
                    " on sendnn-inference 2.x (the default stack) in this harness")
        return cpu_tensor_parallel_problem(ranks, stack)

    @classmethod
    def compile_problem(cls, cfg: EngineConfig) -> str | None:
        """A continuous-batching engine on a card must be of a shape the card compiles
        (harness.targets.spyre.card_shape); static batching compiles its warmup shapes."""
        if not card_shape.compiles_shapes(cfg.backend, cfg.mode):
            return None
        problems = card_shape.shape_problems(cfg.max_model_len, cfg.max_num_seqs,
                                             cfg.max_num_batched_tokens)
        if not problems:
            return None
        return (f"{cfg.variant_id}: a Spyre card does not compile this engine"
                f" ({'; '.join(problems)}); a card compiles {card_shape.RULES}"
                " (harness/targets/spyre/card_shape.py)")

    @classmethod
    def compiled_limits(cls, variant: Any, limits: EngineLimits,
                        round_batch: bool = False) -> EngineLimits:
        if not card_shape.compiles_shapes(variant.backend, variant.mode):
            return limits
        return card_shape.card_limits(limits, round_batch)

    @classmethod
    def geometry_problem(cls, variant: Any, geometry: Any, stack: str) -> str | None:
        problem = super().geometry_problem(variant, geometry, stack)
        if problem or not card_shape.compiles_shapes(variant.backend, variant.mode):
            return problem
        shape = card_shape.shape_problems(geometry.max_model_len, geometry.max_num_seqs,
                                          geometry.chunk_size)
        if shape:
            return (f"{variant.id}: a Spyre card does not compile geometry {geometry.name!r}"
                    f" ({'; '.join(shape)}); a card compiles {card_shape.RULES}: select a"
                    " geometry of that shape (`card`, `tp4`, or the lab's own)")
        return None

    @classmethod
    def join_reservation(cls, tkv: int, prompt_len: int, max_tokens: int,
                         block_size: int) -> int | None:
        """Continuous batching reserves a request's worst case when it joins a batch at
        ``tkv``: every token up to ``max_tokens`` (the last one is never fed back), from the
        batch's tkv, less the blocks that are only its left padding."""
        worst = math.ceil((tkv + max_tokens - 1) / block_size)
        return worst - (tkv - prompt_len) // block_size

    @classmethod
    def full_length_max_tokens(cls, max_model_len: int, prompt_len: int) -> int:
        # A batch shares one tkv: a request joins only if its prompt, padded to the batch's
        # tkv, plus its max_tokens still fit max_model_len. Requests filling max_model_len
        # can join only at step 0, and with chunked prefill the tkv has moved on by then:
        # one block of headroom lets all max_num_seqs requests join while the batch decodes.
        padded = math.ceil(prompt_len / BLOCK_SIZE) * BLOCK_SIZE
        return max_model_len - padded - BLOCK_SIZE

    @classmethod
    def engine_info(cls, vllm_config: Any = None) -> dict[str, Any]:
        info: dict[str, Any] = {}
        try:
            info["card"] = engine_card_info()
        except Exception as e:  # the card check then fails saying what is missing
            info["card"] = {"error": repr(e)}
        try:
            registry = applied_entry(vllm_config)
        except Exception as e:  # the start check then says the entry could not be read
            registry = {"entry": None, "error": repr(e)}
        if registry is not None:
            info["registry"] = registry
        for gen in GENERATIONS:
            if importlib.util.find_spec(gen.module) is not None:
                # deferred: a heavy import, paid only inside an engine process
                module = importlib.import_module(gen.module)
                info["plugin_generation"] = gen.name
                info["plugin_version"] = getattr(module, "__version__", "?")
                break
        return info

    def generation(self) -> PluginGeneration:
        """The plugin generation this engine's stack carries (vllm-spyre 1.x where unknown)."""
        return for_stack(self.cfg.stack) or VLLM_SPYRE

    @classmethod
    def availability_probe(cls, variant: Any) -> str | None:
        if not any(importlib.util.find_spec(gen.module) for gen in GENERATIONS):
            return ("no Spyre plugin (sendnn-inference or vllm-spyre) is installed in this"
                    " environment; run ./setup.sh")
        if variant.backend != "sendnn":
            return None
        scan = discover_spyre(device_root())
        if not scan.usable:
            return scan.why_none()
        _, problem = torch_sendnn_status()
        if problem:
            return f"{len(scan.usable)} Spyre card(s) found, but {problem}"
        return None

    @classmethod
    def near_tie_policy(cls, base: NearTiePolicy, label: str,
                        tols: Mapping[str, float]) -> NearTiePolicy:
        return near_tie_policy(base, cls.backend_of(label), tols.get("sendnn", NEAR_TIE_TOL_SENDNN))

    @classmethod
    def device_env(cls, device: InventoryDevice, cache_dir: Path) -> dict[str, str]:
        return card_env(device, cache_dir)

    @classmethod
    def inherited_env(cls, environ: Mapping[str, str]) -> list[tuple[str, str, str]]:
        return inherited_card_env(environ)

    @classmethod
    def stack_lines(cls, inv: Any) -> tuple[list[str], bool]:
        return card_stack_lines(inv)

    @classmethod
    def device_stack_problem(cls, variant: Any, stack: str) -> str | None:
        return card_stack_problem(variant, stack)

    @classmethod
    def pads_decode_batch(cls, stack: str, variant: str) -> bool:
        return padding.pads_decode_batch(stack, variant)

    @classmethod
    def padding_declaration(cls) -> str:
        return padding.DECLARED_IN

    def holds_device(self) -> bool:
        # A card engine holds the card; an eager engine on a listed stand-in runs on the CPU.
        return super().holds_device() and self.cfg.backend == "sendnn"

    def verify_device(self, info: dict[str, Any], log_text: str) -> str | None:
        # First the plugin: vLLM falls back to its own platform when VLLM_PLUGINS names none.
        return (platform_problem(self.generation(), info, self.cfg.label)
                or verify_card_engine(self.cfg, info, log_text))

    def check_started(self, info: dict[str, Any]) -> str | None:
        """On a card: the engine runs with what the plugin's registry entry declares."""
        return entry_problem(info)

    @classmethod
    def registry_geometry(cls, entry: str, chosen: Mapping[str, Any]) -> Mapping[str, Any] | None:
        return entry_geometry(entry, chosen)

    @classmethod
    def report_parameters(cls, info: dict[str, Any]) -> dict[str, str]:
        label = entry_label(info)
        return {"registry entry": label} if label else {}

    @classmethod
    def emulated_runtime(cls, variant: Any) -> str | None:
        if variant.backend != "sendnn":
            return None
        version, _ = engine_python_sendnn()
        return f"torch_sendnn {version}" if version and "(emulated)" in version else None

    @classmethod
    def allow_emulated_env(cls) -> dict[str, str]:
        return {ALLOW_EMULATED_ENV: "1"}

    @classmethod
    def needs_device(cls, variant: Any) -> bool:
        return variant.backend == "sendnn"  # eager runs on the CPU

    @classmethod
    def serves(cls, device: InventoryDevice, backend: str | None, mode: str | None) -> bool:
        # An inventory may list an eager (CPU-mode) stand-in as a spyre device.
        return super().serves(device, backend, mode) and (device.backend or "sendnn") == backend

    @classmethod
    def stack_feature_problem(cls, variant: Any, stack: str) -> str | None:
        gen = for_stack(stack)
        if gen is None or variant.mode in gen.modes:
            return None
        return (f"{variant.id} does not run on stack {stack}: {gen.name} has no mode"
                f" {variant.mode!r} (its modes: {', '.join(gen.modes)})")

    @classmethod
    def validate(cls, cfg: EngineConfig) -> None:
        super().validate(cfg)
        if cfg.mode == "sb":
            if cfg.warmup is None:
                raise ConfigError("spyre static batching (sb) needs a warmup shape")
            if cfg.warmup.prompt_len % BLOCK_SIZE:
                raise ConfigError(
                    f"spyre sb warmup prompt length {cfg.warmup.prompt_len} is not a multiple"
                    f" of {BLOCK_SIZE}; vllm-spyre refuses it"
                )
        elif cfg.max_model_len % BLOCK_SIZE:
            raise ConfigError(
                f"spyre {cfg.mode} max_model_len {cfg.max_model_len} is not a multiple of the"
                f" {BLOCK_SIZE}-token KV block"
            )
        gen = for_stack(cfg.stack)
        if gen is not None and cfg.mode not in gen.modes:
            raise ConfigError(
                f"{gen.name} (stack {cfg.stack}) has no mode {cfg.mode!r}; its modes:"
                f" {', '.join(gen.modes)}"
            )
        if cfg.mode in CHUNKED_MODES:
            chunk = cfg.max_num_batched_tokens
            if chunk is None or chunk % BLOCK_SIZE:
                raise ConfigError(
                    f"spyre chunked prefill needs max_num_batched_tokens a multiple of"
                    f" {BLOCK_SIZE}; got {chunk}"
                )

    def engine_env(self) -> dict[str, str]:
        cfg = self.cfg
        gen = self.generation()
        env = super().engine_env()
        env.update({
            "VLLM_PLUGINS": gen.plugin,
            gen.var("DYNAMO_BACKEND"): str(cfg.backend),
            **gen.mode_env(str(cfg.mode)),
            # The worker initialises torch.distributed with init_method="env://"; the engine
            # process picks MASTER_PORT as it starts, not the harness ahead (harness.core.ports).
            "MASTER_ADDR": "127.0.0.1",
            BIND_PORTS_ENV: "MASTER_PORT",
        })
        if cfg.backend == "eager":
            # The default compiles sampler helpers with gcc: ~10 s for nothing on CPU.
            env[gen.var("SIMPLE_COMPILE_BACKEND")] = "eager"
        if cfg.mode == "sb":
            assert cfg.warmup is not None
            env.update({
                gen.var("WARMUP_PROMPT_LENS"): str(cfg.warmup.prompt_len),
                gen.var("WARMUP_NEW_TOKENS"): str(cfg.warmup.new_tokens),
                gen.var("WARMUP_BATCH_SIZES"): str(cfg.warmup.batch_size),
            })
        if cfg.backend == "sendnn":  # called just before the start: the card's cache exists
            prepare_card_start({**env, **dict(cfg.extra_env)})
        return env

    def llm_kwargs(self) -> dict[str, Any]:
        kw = super().llm_kwargs()
        kw.update(self.generation().mode_kwargs(str(self.cfg.mode)))
        if self.cfg.mode == "sb":
            # vllm-spyre derives both limits from the warmup shape.
            w = self.cfg.warmup
            assert w is not None
            kw["max_model_len"] = w.prompt_len + w.new_tokens
            kw["max_num_seqs"] = w.batch_size
        return kw

    def check_request(self, prompt_len: int, max_tokens: int) -> None:
        cfg = self.cfg
        if cfg.mode == "sb":
            w = cfg.warmup
            assert w is not None
            if prompt_len > w.prompt_len or max_tokens > w.new_tokens:
                raise ConfigError(
                    f"request (prompt {prompt_len} tokens, max_tokens {max_tokens}) does not fit"
                    f" the static-batching warmup shape (prompt_len {w.prompt_len}, new_tokens"
                    f" {w.new_tokens}); raise the warmup shape or shorten the request"
                )
            return
        padded = math.ceil(prompt_len / BLOCK_SIZE) * BLOCK_SIZE
        if padded + max_tokens > cfg.max_model_len:
            raise ConfigError(
                f"prompt of {prompt_len} tokens (padded to {padded}, the next multiple of"
                f" {BLOCK_SIZE}) + max_tokens {max_tokens} exceeds max_model_len"
                f" {cfg.max_model_len} on {cfg.label}; shorten the prompt or lower max_tokens"
            )


KIND = SpyreTarget
