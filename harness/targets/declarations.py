"""The values a target kind declares: its variants (``TargetVariant``) and what they can do
(``CAPABILITIES``), its KV-pool geometry (``PoolGeometry``), the wider near-tie tolerance of a
reduced-precision backend (``NearTieTolerance``), and the environment every engine runs offline
with."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from harness.core.config import EngineConfig, WarmupShape
from harness.core.cpu_share import cores as cpu_cores
from harness.core.cpu_share import usable_cores

if TYPE_CHECKING:
    from harness.scenario.prompts import EngineLimits

# Nothing may come from a model hub or phone home during a run.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_HOST_IP": "127.0.0.1",
    # Keep the engine core in the engine process so the scheduler, KV-cache
    # manager and model runner can be read between steps.
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_USE_V1": "1",
    "TOKENIZERS_PARALLELISM": "false",
}

# What every rank of a tensor-parallel engine mixes into its worker (vLLM's
# ``worker_extension_cls``): imported in each rank's own process before its model is built, it
# installs the engine's faults there and answers the engine process's questions to its ranks.
RANK_EXTENSION = "harness.in_engine.ranks.RankExtension"


def cpu_rank_binding(ranks: int) -> str | None:
    """The cores each of ``ranks`` CPU ranks binds its threads to, as vLLM's CPU worker reads
    them (``VLLM_CPU_OMP_THREADS_BIND``: one list per rank, ``|`` between ranks): the cores this
    process may run on, split into ``ranks`` contiguous groups of equal size. None where there
    are fewer cores than ranks (two ranks on one core would only contend)."""
    cores = cpu_cores()
    if ranks < 1 or len(cores) < ranks:
        return None
    per = len(cores) // ranks
    groups = [cores[i * per:(i + 1) * per] for i in range(ranks)]
    return "|".join(",".join(map(str, g)) for g in groups)


# The stacks whose CPU engines run tensor-parallel ranks in this harness: vLLM's multiprocess
# executor with a worker extension (``RANK_EXTENSION``), proven on them by tests/e2e.
CPU_TP_STACKS = ("default",)


def cpu_tensor_parallel_problem(ranks: int, stack: str) -> str | None:
    """Why a CPU engine cannot run ``ranks`` tensor-parallel ranks on ``stack`` here (one core
    per rank at least, a stack where the ranks are proven), or None."""
    if stack not in CPU_TP_STACKS:
        return (f"tensor-parallel CPU engines run on the {' and '.join(CPU_TP_STACKS)} stack,"
                f" not on {stack}")
    if usable_cores() < ranks:
        return (f"TP {ranks} needs {ranks} CPU cores, one per rank; this process may use"
                f" {usable_cores()}")
    return None


# What a device computes in where its kind says nothing else (vLLM loads our fp32 checkpoints).
MODEL_DTYPE = "the model's dtype (fp32)"
# The precisions the checks know, by the torch dtype an engine reports (``model_dtype``).
PRECISION_OF_DTYPE = {"torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16"}


def device_dtypes(precision: str) -> str:
    """The near-tie policy's statement of the dtypes compared, for a device in ``precision``."""
    dtype = MODEL_DTYPE if precision == "fp32" else precision
    return f"reference fp32 (transformers on the CPU) vs device {dtype}"


@dataclass(frozen=True)
class NearTieTolerance:
    """A backend that computes in a lower precision than the fp32 reference, and the wider
    near-tie tolerance it gets (the option ``--near-tie-tol-BACKEND``)."""

    backend: str
    default: float
    why: str  # in the option's help: "the card computes fp16 against the fp32 reference"


# -- KV pool geometry --------------------------------------------------------------------


@dataclass(frozen=True)
class PoolGeometry:
    """How a kind lays out its KV pool.

    ``block_size`` tokens per block, or None for one block per sequence
    (block_size = max_model_len, the Neuron geometry); ``pad_blocks`` the blocks
    the platform keeps back (vLLM's null block, Spyre's pad block 0); ``fixed``
    when the platform sets the block size itself and a configuration cannot.
    """

    block_size: int | None
    pad_blocks: int = 1
    fixed: bool = False

    def block_tokens(self, max_model_len: int) -> int:
        return self.block_size if self.block_size is not None else max_model_len

    def engine_overrides(
        self, max_model_len: int, max_num_seqs: int, extra_blocks: int = 0
    ) -> dict[str, int]:
        """``block_size`` and ``num_blocks_override`` for exactly a full batch of
        full-length requests (plus ``extra_blocks``); {} when the platform decides."""
        if self.fixed:
            return {}
        size = self.block_tokens(max_model_len)
        per_request = -(-max_model_len // size)
        blocks = max_num_seqs * per_request + self.pad_blocks + extra_blocks
        return {"block_size": size, "num_blocks_override": blocks}

    def pool_for(self, max_model_len: int, requests: int) -> dict[str, int]:
        """The block count (and, where the platform lets it be set, the block size) of a pool
        for ``requests`` full-length requests plus the pad blocks."""
        size = self.block_tokens(max_model_len)
        blocks = requests * -(-max_model_len // size) + self.pad_blocks
        return ({"num_blocks_override": blocks} if self.fixed
                else {"block_size": size, "num_blocks_override": blocks})


# -- capabilities ------------------------------------------------------------------------

# What a variant can do, the one vocabulary: a variant declares its own
# (``TargetVariant.capabilities``), a suite asks for what it needs
# (``@pytest.mark.hil_needs(...)``, harness/plugin/selection.py) and runs on every variant that
# has it; no suite names a kind, a backend or a mode.
CAPABILITIES: dict[str, str] = {
    "kv_ledger": "requests join its running batch at any engine step, and its KV blocks are read"
                 " at every step (the KV ledgers): the step-driven KV suites",
    "harness_sized_pool": "the harness sets its KV pool's block size and block count, any it"
                          " chooses, and refuses a pool too small for one request before start",
    "refuses_small_pool": "its stack refuses, at engine start, a KV pool that cannot serve one"
                          " full-length request (with the kind's ``capacity_refusal`` text)",
    "join_reservation": "its batching reserves a request's worst case of blocks when the request"
                        " joins a batch (the kind's ``join_reservation``), and rounds a pool to a"
                        " multiple of max_num_seqs",
    "forced_preemption": "its pool never runs out by itself, so a preemption is forced through"
                         " vLLM's scheduler (fault preempt-running-once), and its runner takes"
                         " part in it",
    "pausing": "its scheduler pauses a decoding request (the request keeps its blocks) when the"
               " batch TKV limit would be passed; a stack may lack it (the kind's"
               " ``capability_problem`` says why)",
    "holds_back_on_blocks": "its scheduler admits a request only where the pool can hold all it"
                            " may need (prompt and max_tokens, or its worst case) beside what it"
                            " reserved for the others, and otherwise holds it back: it never"
                            " preempts for blocks; a stack may lack it (the kind's"
                            " ``capability_problem`` says why)",
    "prefix_caching": "it serves a prompt's prefix from its KV cache when asked"
                      " (``EngineConfig.prefix_caching``; on by its mode where the mode is prefix"
                      " caching's), reporting the cached tokens and running only the rest",
}


def unknown_capabilities(names: tuple[str, ...] | list[str]) -> list[str]:
    """The names among ``names`` that are no capability of ``CAPABILITIES``, in order."""
    return [n for n in names if n not in CAPABILITIES]


# -- variants ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TargetVariant:
    """One (kind, backend, mode) a suite runs on, with its markers.

    The first marker is the platform marker (``cpu``, ``spyre``, ``neuron``):
    what ``-m`` and ``hil nightly`` select on.
    """

    id: str
    target: str
    backend: str | None
    mode: str | None
    markers: tuple[str, ...]
    device: str | None = None  # inventory id of the leased device, once leased
    device_env: tuple[tuple[str, str], ...] = ()
    chunked: bool = False  # prefills in chunks of the prompt set's cp_chunk tokens
    # Runs only in tests carrying one of these markers (a suite's marker, e.g. token_equality);
    # empty: in every test its target runs in.
    suites: tuple[str, ...] = ()
    # What it can do (names of CAPABILITIES): the suites that need them run on it.
    capabilities: tuple[str, ...] = ()
    # The capability this variant has switched off (pausing off): a control, not a copy of
    # every suite. It runs only where --target names its mode or id, and there only in the
    # tests that run the controls of that capability (hil_controls) and in those that need no
    # capability at all (``opt_in``).
    switches_off: str | None = None

    @property
    def platform_marker(self) -> str:
        return self.markers[0]

    @property
    def opt_in(self) -> bool:
        """Selected only where --target names its mode or id (a control: ``switches_off``)."""
        return self.switches_off is not None

    def has(self, capability: str) -> bool:
        """Whether this variant declares ``capability`` (one of CAPABILITIES)."""
        return capability in self.capabilities

    def admitted(self, needs: frozenset[str], controls: frozenset[str]) -> bool:
        """Whether a test that needs the capabilities ``needs`` and runs the controls of
        ``controls`` runs on this variant (once --target selected it): it has every need;
        a control stands in for the capability it switches off where the test runs that
        capability's controls, and elsewhere only in a test that needs nothing."""
        if self.switches_off is None:
            return needs <= set(self.capabilities)
        if self.switches_off in controls:
            return needs <= {*self.capabilities, self.switches_off}
        return not needs and not controls

    def on_device(self, device: str, env: dict[str, str]) -> TargetVariant:
        """This variant bound to a leased device and its environment."""
        return replace(self, device=device, device_env=tuple(sorted(env.items())))

    def engine_config(
        self, model: str, limits: EngineLimits, **overrides: object
    ) -> EngineConfig:
        """The engine configuration of this variant for a model and engine limits."""
        warmup = None
        if self.mode == "sb":
            if limits.sb_warmup is None:
                raise ValueError(f"{self.id} needs sb_warmup in the prompt set's engine limits")
            warmup = WarmupShape(*limits.sb_warmup)
        kwargs: dict[str, object] = dict(
            target=self.target,
            model=model,
            max_model_len=limits.max_model_len,
            max_num_seqs=limits.max_num_seqs,
            mode=self.mode,
            backend=self.backend,
            warmup=warmup,
            max_num_batched_tokens=limits.cp_chunk if self.chunked else None,
            device=self.device,
            extra_env=self.device_env,
        )
        kwargs.update(overrides)
        return EngineConfig(**kwargs)  # type: ignore[arg-type]

