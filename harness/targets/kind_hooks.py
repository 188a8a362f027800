"""The optional hooks of a target kind: what a kind may declare, each with a neutral default.

``TargetKind`` (``harness/targets/base.py``) holds what every kind must declare; everything here
is optional: a kind overrides only where its device differs from the CPU (its modes and
backends, its pool geometry, its precision, its device environment and verification, its
stack report for ``hil devices``, its dummy padding, its faults and ledger readers).
``KindHooks`` are the kind's class-level hooks, ``EngineHooks`` those of a kind that runs
engines (``VllmTarget``), asked of one engine's configuration.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from harness.checks.dummy_padding import dummy_padding_verdict
from harness.core.comparison import NearTiePolicy
from harness.core.config import ConfigError, EngineConfig
from harness.core.devices import InventoryDevice
from harness.core.settings import Variable
from harness.core.verdict import Verdict
from harness.targets.declarations import (
    NearTieTolerance,
    PoolGeometry,
    TargetVariant,
    device_dtypes,
)
from harness.targets.device_kind import DeviceKind

if TYPE_CHECKING:
    from harness.core.trace import Trace
    from harness.geometry.catalog import Geometry
    from harness.scenario.prompts import EngineLimits


class KindHooks:
    """The optional class-level declarations and hooks of a kind (neutral defaults)."""

    # Required of every kind (TargetKind, harness/targets/base.py); named here for the hooks.
    name: ClassVar[str]
    device: ClassVar[DeviceKind]
    modes: ClassVar[tuple[str, ...]] = ()  # e.g. sb / cb / cp
    chunks_prefill: ClassVar[bool] = False  # splits any prompt longer than max_num_batched_tokens
    mode_help: ClassVar[str] = ""
    backends: ClassVar[tuple[str, ...]] = ()
    backend_help: ClassVar[str] = ""
    variants: ClassVar[tuple[TargetVariant, ...]] = ()
    markers: ClassVar[dict[str, str]] = {}  # the markers its variants carry, with their meaning
    geometries: ClassVar[dict[str, PoolGeometry]] = {"default": PoolGeometry(None)}
    # The pool geometry (a name of ``geometries``) of a pool the harness sizes in requests.
    sized_pool_geometry: ClassVar[str] = "default"
    # The engine variable that sets the kind's batch TKV limit (a Spyre compiler's batch size x
    # TKV); None: its batching has no such limit, and a geometry that sets one does not apply.
    batch_tkv_limit_env: ClassVar[str | None] = None
    # What a fork-server parent imports once vLLM resolved this kind's platform: the module
    # prefix of the platform's class -> the worker and runner modules an engine start pulls in
    # (handed to the parent in its environment by harness.engine.start_config).
    plugin_preload: ClassVar[dict[str, tuple[str, ...]]] = {}
    # Modules that register this kind's faults (harness.in_engine.fault_registry): named in every
    # engine's configuration (harness.engine.start_config) and imported there by
    # harness.in_engine.faults; on the harness side the registry imports them.
    fault_modules: ClassVar[tuple[str, ...]] = ()
    # Modules that register readers of this kind's own KV ledgers with
    # harness.in_engine.probes: named in its engines' configuration, imported there before the
    # first snapshot.
    probe_modules: ClassVar[tuple[str, ...]] = ()
    # Where a kind-free fault reaches this kind's plugin runner: hook name (the hooks of
    # harness.in_engine.kind_modules, e.g. BATCH_ORDER) -> "module:function", named in its
    # engines' configuration and called in the engine process.
    runner_hooks: ClassVar[dict[str, str]] = {}
    # Engine-start limits (seconds) longer than the harness's default, keyed by what they apply
    # to: a backend of this kind, or the kind's name for all its engines.
    start_timeouts: ClassVar[dict[str, float]] = {}
    near_tie_tolerances: ClassVar[tuple[NearTieTolerance, ...]] = ()
    # Backends that compute in a lower precision than the fp32 reference, and which ("fp16",
    # "bf16"): their checks judge by that precision's calibrated noise (harness.calibration,
    # harness.session.precision); every other backend computes in fp32.
    backend_precisions: ClassVar[dict[str, str]] = {}
    # Prefixes of the variables this kind's stack reads when an engine is built, after the
    # fork (harness.engine.forkserver): a fork-server parent is not keyed on them.
    late_env_prefixes: ClassVar[tuple[str, ...]] = ()
    # Prefixes of the variables that place one engine on its device (which card, its rank's
    # cards, its compile cache): given to each engine at its fork and never part of a
    # fork-server parent's environment, so the engines of every card share one parent. A parent
    # whose imports read one of them by name serves no engine that sets it (its record says).
    per_engine_env_prefixes: ClassVar[tuple[str, ...]] = ()
    # The kind's stack refuses, at engine start, a pool that cannot serve one full-length
    # request; for the others the harness preflight refuses it (harness.checks.capacity).
    refuses_small_pool: ClassVar[bool] = False
    # A fragment of the first line of that refusal (the report files it as a capacity failure,
    # test_capacity.py expects it); None: the stack has no refusal of its own.
    capacity_refusal: ClassVar[str | None] = None
    # The module that declares this kind's ``hil selftest`` cases (CASES, run on every host;
    # DEVICE_CASES, where the host has a device of this kind; DEVICE_ONLY_FAULTS and
    # DEVICE_ONLY_WHY: faults with no case off the device), imported by harness.selftest through
    # the registry (``selftest_modules()``).
    selftest_module: ClassVar[str | None] = None
    # The ``KvSnapshot.source`` names of the ledgers this kind's probe_modules read.
    ledger_sources: ClassVar[tuple[str, ...]] = ()
    # (report label, distribution) of the packages this kind's stack brings beside vLLM: the
    # report's environment shows their versions, and the shards of one run must agree on them.
    distributions: ClassVar[tuple[tuple[str, str], ...]] = ()
    # The vendor runtime distributions this kind's engines run on where a device is (not a
    # stack's pins: the host's): part of what a triage record is valid for.
    runtime_distributions: ClassVar[tuple[str, ...]] = ()
    # ``hil`` sub-commands of this kind's own: name -> "module:function", the function adding
    # the command's parser (``fn(subparsers, repo_root)``) to the ``hil`` command.
    commands: ClassVar[dict[str, str]] = {}
    # The HIL_* variables this kind (its package, its stack files) reads or sets, declared with
    # the settings layer (harness.core.settings) by the kind registry.
    variables: ClassVar[tuple[Variable, ...]] = ()

    @classmethod
    def geometry(cls, name: str = "default") -> PoolGeometry:
        try:
            return cls.geometries[name]
        except KeyError:
            raise KeyError(
                f"{cls.name} has no pool geometry {name!r}; known: {', '.join(cls.geometries)}"
            ) from None

    @classmethod
    def backend_of(cls, label: str) -> str:
        """The backend a trace or engine label of this kind names (``spyre-sendnn-cb``:
        sendnn); the kind's name where it has no backends."""
        variant = label.rpartition(":")[2]
        for backend in cls.backends:
            if f"-{backend}" in variant:
                return backend
        return cls.name

    @classmethod
    def precision(cls, label: str) -> str:
        """What the engine labelled ``label`` computes in: "fp32", "fp16" or "bf16"."""
        return cls.backend_precisions.get(cls.backend_of(label), "fp32")

    @classmethod
    def trace_precision(cls, label: str, info: Mapping[str, Any]) -> str:
        """What the engine that recorded a trace computed in, ``info`` being what it reported
        about itself: the backend's declaration (``precision``). A kind whose engines' dtype
        is decided elsewhere (a lab inventory) reads the engine's report instead."""
        return cls.precision(label)

    @classmethod
    def reduced_precision(cls, label: str) -> bool:
        """Whether the engine labelled ``label`` computes in a lower precision than fp32."""
        return cls.precision(label) != "fp32"

    @classmethod
    def capability_problem(cls, variant: TargetVariant, capability: str,
                           stack: str) -> str | None:
        """Why ``variant`` on ``stack`` lacks ``capability``, which the variant declares (its
        stack's software has no such thing: a skip saying so), or None: it has it."""
        return None

    @classmethod
    def join_reservation(cls, tkv: int, prompt_len: int, max_tokens: int,
                         block_size: int) -> int | None:
        """Blocks the kind's batching reserves for a request joining a batch at ``tkv``;
        None where a request reserves nothing when it joins (blocks come as it grows)."""
        return None

    @classmethod
    def stack_geometry(cls, name: str, stack: str) -> PoolGeometry:
        """The geometry ``name`` as ``stack``'s software takes it (a block size its attention
        accepts); the declared one by default."""
        return cls.geometry(name)

    @classmethod
    def full_batch_pool(cls, max_model_len: int, max_num_seqs: int,
                        stack: str = "default") -> dict[str, int]:
        """EngineConfig overrides for a KV pool of exactly a full batch of full-length
        requests plus the pad block; {} where the device sizes its own pool."""
        return {}

    @classmethod
    def geometry_problem(cls, variant: TargetVariant, geometry: Geometry,
                         stack: str) -> str | None:
        """Why ``variant`` cannot run in ``geometry`` (a skip quoting it), or None."""
        if geometry.tensor_parallel_size != 1:
            problem = cls.tensor_parallel_problem(variant, geometry.tensor_parallel_size, stack)
            if problem:
                return f"geometry {geometry.name!r} (TP {geometry.tensor_parallel_size}): {problem}"
        if geometry.batch_tkv_limit is not None and cls.batch_tkv_limit_env is None:
            return (f"{variant.id} has no batch TKV limit: geometry {geometry.name!r} (limit"
                    f" {geometry.batch_tkv_limit}) would run as its own pool and batch alone")
        return None

    @classmethod
    def compile_problem(cls, cfg: EngineConfig) -> str | None:
        """Why the device would not compile an engine of ``cfg``'s shape (a skip quoting it:
        the test asked for a shape the device does not run), or None; a kind whose device
        compiles no fixed shapes has no such problem."""
        return None

    @classmethod
    def compiled_limits(cls, variant: TargetVariant, limits: EngineLimits,
                        round_batch: bool = False) -> EngineLimits:
        """The smallest limits the device compiles that hold a test's ``limits`` (the test's
        own where the device takes any shape); the batch too with ``round_batch`` (a test
        whose batch size is not its subject)."""
        return limits

    @classmethod
    def tensor_parallel_problem(cls, variant: TargetVariant, ranks: int,
                                stack: str) -> str | None:
        """Why an engine of ``variant`` on ``stack`` cannot run ``ranks`` tensor-parallel ranks
        here (a skip quoting it), or None. A kind runs one rank per engine unless it says."""
        return f"{variant.id} runs one rank per engine in this harness"

    @classmethod
    def geometry_overrides(cls, geometry: Geometry, stack: str) -> dict[str, Any]:
        """EngineConfig overrides that make an engine of this kind serve in ``geometry``: its
        pool (a full batch by the kind's rule, a number of full-length requests, a block count,
        or none: the device decides), prefix caching where the geometry sets it, and the batch
        TKV limit as the kind's variable (``extra_env``, which the caller joins to the
        variant's own), and its ranks per engine."""
        over: dict[str, Any] = {}
        if geometry.pool == "full-batch":
            over.update(cls.full_batch_pool(geometry.max_model_len, geometry.max_num_seqs, stack))
        elif geometry.pool_requests is not None:
            over.update(cls.stack_geometry(cls.sized_pool_geometry, stack)
                        .pool_for(geometry.max_model_len, geometry.pool_requests))
        elif geometry.num_blocks is not None:
            over["num_blocks_override"] = geometry.num_blocks
        if geometry.prefix_caching is not None:
            over["prefix_caching"] = geometry.prefix_caching
        if geometry.tensor_parallel_size != 1:
            over["tensor_parallel_size"] = geometry.tensor_parallel_size
        if geometry.batch_tkv_limit is not None and cls.batch_tkv_limit_env:
            over["extra_env"] = ((cls.batch_tkv_limit_env, str(geometry.batch_tkv_limit)),)
        return over

    @classmethod
    def full_length_max_tokens(cls, max_model_len: int, prompt_len: int) -> int:
        """max_tokens for a request of ``prompt_len`` tokens that holds as many KV blocks as a
        request can: its prompt and output fill max_model_len, no headroom (a kind whose
        batching needs some, as Spyre's shared tkv does, says how much)."""
        return max_model_len - prompt_len

    @classmethod
    def engine_info(cls) -> dict[str, Any]:
        """Run inside the engine process after start: the facts this kind's post-start
        verification reads there (none by default)."""
        return {}

    @classmethod
    def availability_probe(cls, variant: TargetVariant) -> str | None:
        """None when this machine can run ``variant``, else a precise reason to skip."""
        return None

    @classmethod
    def start_limit(cls, backend: str | None) -> float | None:
        """Seconds an engine of this kind on ``backend`` may take to start (``start_timeouts``:
        the backend's, else the kind's); None: the harness's default."""
        return cls.start_timeouts.get(str(backend), cls.start_timeouts.get(cls.name))

    @classmethod
    def needs_device(cls, variant: TargetVariant) -> bool:
        """Whether engines of ``variant`` run only under a lease of a device that serves it
        (never unleased, where they would open whatever their environment names)."""
        return cls.device.leased

    @classmethod
    def emulated_runtime(cls, variant: TargetVariant) -> str | None:
        """What of ``variant``'s device runtime is emulated on this host (a line for the
        report), or None where it is the vendor's own."""
        return None

    @classmethod
    def allow_emulated_env(cls) -> dict[str, str]:
        """What an engine's environment says when the run allows an emulated runtime."""
        return {}

    @classmethod
    def serves(cls, device: InventoryDevice, backend: str | None, mode: str | None) -> bool:
        """Whether an engine of this kind, backend and mode runs on ``device``."""
        if device.kind != cls.device.name:
            return False
        return not device.features or mode in device.features

    @classmethod
    def validate(cls, cfg: EngineConfig) -> None:
        """Raise ConfigError naming the bad value of ``cfg`` and the fix."""
        if not cls.modes:
            if cfg.mode is not None or (cfg.backend is not None and cfg.backend not in cls.backends):
                takes = f"backend {' or '.join(cls.backends)}" if cls.backends else "backend"
                raise ConfigError(
                    f"target {cfg.target!r} takes no mode and no {takes} (got mode={cfg.mode!r},"
                    f" backend={cfg.backend!r}); modes and backends are other kinds'"
                )
            return
        if cfg.mode not in cls.modes:
            raise ConfigError(
                f"unknown {cls.name} mode {cfg.mode!r}; known modes: {', '.join(cls.modes)}"
                + (f" ({cls.mode_help})" if cls.mode_help else "")
            )
        if cfg.backend not in cls.backends:
            raise ConfigError(
                f"unknown {cls.name} backend {cfg.backend!r}; known backends:"
                f" {', '.join(cls.backends)}" + (f" ({cls.backend_help})" if cls.backend_help else "")
            )

    @classmethod
    def near_tie_policy(cls, base: NearTiePolicy, label: str,
                        tols: Mapping[str, float]) -> NearTiePolicy:
        """The near-tie policy for a trace of this kind labelled ``label`` (``spyre-sendnn-cb``):
        ``base`` with the dtypes compared, stated in every diff, and where the backend computes
        in a lower precision its wider tolerance (``tols``: the ``--near-tie-tol-BACKEND``
        values given; a backend missing there gets its ``near_tie_tolerances`` default)."""
        return replace(base, dtypes=device_dtypes(cls.precision(label)))

    @classmethod
    def device_env(cls, device: InventoryDevice, cache_dir: Path) -> dict[str, str]:
        """What an engine on the leased ``device`` needs in its environment, before the
        inventory's own ``env`` for it is laid on top (none by default)."""
        return {}

    @classmethod
    def inherited_env(cls, environ: Mapping[str, str]) -> list[tuple[str, str, str]]:
        """(name, value, what it does) for each variable of ``environ`` that this kind's engines
        would inherit and that changes them (``hil devices``, the report's environment)."""
        return []

    @classmethod
    def host_lines(cls) -> list[str]:
        """``hil devices`` after discovery: what this kind's engines need besides the device
        (its SDK, its stack), one line each."""
        return []

    @classmethod
    def stack_lines(cls, inv: Any) -> tuple[list[str], bool]:
        """``hil devices``: the report on the stack that drives this kind's devices of the
        inventory ``inv``, and whether it can (False fails a lab's pre-flight)."""
        return [], True

    @classmethod
    def pads_decode_batch(cls, stack: str, variant: str) -> bool:
        """Whether ``variant`` on ``stack`` pads a lone decoding request with a dummy request that
        holds KV blocks: declared, not read from the run, so a ledger adapter that stops seeing
        the dummy fails the dummy-padding test instead of turning it into a skip."""
        return False

    @classmethod
    def padding_declaration(cls) -> str:
        """The file that declares ``pads_decode_batch`` (named in the verdict's messages)."""
        return cls.__module__.replace(".", "/") + ".py"

    @classmethod
    def dummy_padding_verdict(cls, trace: Trace, stack: str, variant: str) -> Verdict | None:
        """The dummy-padding verdict of a run where one request decodes alone before a second
        joins; None where the stack declares no padding and none was seen (nothing to check)."""
        return dummy_padding_verdict(trace, cls.pads_decode_batch(stack, variant), stack, variant,
                                     cls.padding_declaration())



class EngineHooks:
    """The optional hooks of a kind that runs engines, asked of one engine's configuration
    (``self.cfg``) or of its variants (neutral defaults). Mixed into ``VllmTarget`` before
    ``TargetKind``, whose ``KindHooks`` give ``start_limit`` and ``device``."""

    cfg: EngineConfig
    device: ClassVar[DeviceKind]
    start_limit: Any  # KindHooks.start_limit, through VllmTarget

    @classmethod
    def stack_probe(cls, variant: Any, stack: str) -> str | None:
        """None when engines of ``variant`` can run on ``stack``, else why not (device-missing)."""
        return None

    @classmethod
    def stack_feature_problem(cls, variant: Any, stack: str) -> str | None:
        """Why the software of ``stack`` has no ``variant`` at all (a plain skip, whatever the
        device: a plugin generation without the mode), or None."""
        return None

    @classmethod
    def model_probe(cls, model_dir: Any) -> str | None:
        """None when this target serves the model's family, else why not (a skip)."""
        return None

    @classmethod
    def device_stack_problem(cls, variant: Any, stack: str) -> str | None:
        """Why ``stack`` cannot drive a leased device of ``variant`` (checked before the lease: a
        stack problem, never a broken device), or None."""
        return None

    def holds_device(self) -> bool:
        """Whether this engine holds its leased device whole (one engine per device at a time,
        recorded in the pool's device ledger): by default any engine on a leased device."""
        return bool(self.cfg.device) and self.device.leased

    def start_timeout(self) -> float | None:
        """Seconds this engine may take to start (``start_timeouts``); None: the harness's default."""
        return self.start_limit(self.cfg.backend)

    def verify_device(self, info: dict[str, Any], log_text: str) -> str | None:
        """After start, before anything else is checked: why the engine does not run on the
        device it leased as this kind asked (from ``info`` and this start's engine log), or None."""
        return None

    def check_started(self, info: dict[str, Any]) -> str | None:
        """After start: why the engine is not what this target asked for, or None."""
        return None

    @classmethod
    def registry_geometry(cls, entry: str,
                          chosen: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The geometry values (``harness.geometry.catalog.ENTRY_KEYS``) of the device's
        registry entry ``entry``, in the shape ``chosen`` picks; None where the kind reads no
        model registry; ConfigError where the entry or the shape is not there."""
        return None

    @classmethod
    def report_parameters(cls, info: dict[str, Any]) -> dict[str, str]:
        """Report parameters (name -> value) a test's result carries from its engine's facts
        (``info``): what the device configured itself with."""
        return {}
