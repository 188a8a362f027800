"""Faults injected into the real stack, to prove that each check can fail.

A fault is named in ``EngineConfig.faults`` (or with ``--inject-fault``) as
``NAME`` or ``NAME:key=value,key=value`` (``variant=ID`` installs it only in that target
variant's engines, ``stack=NAME`` only in that stack's, ``default`` the default stack's);
NAME is a key of ``FAULTS``, or a ``package.module.function`` path when
``--allow-external-faults`` is given. It runs inside the engine process before
vLLM builds the engine, so it can patch vLLM or a plugin at class level.
Faults print a ``[hil] fault`` line to the engine log when they fire.

Each fault is registered where it is defined (``@fault("NAME")``,
``harness.in_engine.fault_registry``), in a module per subsystem it patches: ``block_pool``
(vLLM's block pool and KV cache managers), ``scheduler`` (preemptions and their counters,
when a finished request's blocks are freed), ``logits`` (what the sampler sees), ``kernels``
(a model kernel's numbers, inside the forward pass), ``engine``
(the engine process, its KV block count) and ``conditions`` (bugs that show under one
condition of a run only, one per condition triage varies); a target kind's own faults live
in its package, in the modules its ``fault_modules`` names. Those reach this package by name
(``load_fault_modules``): in the engine process from the engine's configuration
(``harness.in_engine.kind_modules``, read by ``apply_faults``), on the harness side from the
kind registry (``harness.targets``), which loads every kind's when it is imported, so that
option and inventory validation and ``hil selftest`` see every fault. The registry of faults
sits beside this package, not in it, so a kind's fault module imports it without running this
loader: no import loop. None imports vLLM or a plugin before a fault is installed.
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Collection, Iterable
from typing import Any

from harness.in_engine.fault_registry import FAULT_STATE_ENV, FAULTS, FaultFn, arm, armed
from harness.in_engine.faults import (  # noqa: F401 - they register their faults
    block_pool,
    conditions,
    engine,
    kernels,
    logits,
    scheduler,
)
from harness.in_engine.kind_modules import KindModules, import_modules

__all__ = [
    "ALLOW_EXTERNAL_ENV", "FAULTS", "FAULT_STATE_ENV", "FaultFn", "apply_faults", "arm", "armed",
    "GENERIC_KEYS", "check_fault_rank", "check_fault_spec", "check_fault_specs", "engine_stack",
    "engine_variant", "env_fault_specs", "load_fault_modules", "parse_fault",
]

ALLOW_EXTERNAL_ENV = "HIL_ALLOW_EXTERNAL_FAULTS"


def load_fault_modules(names: Iterable[str]) -> None:
    """Import the named fault modules (each registers its faults), then put ``FAULTS`` in name
    order, whichever module registered them."""
    import_modules(names)
    ordered = sorted(FAULTS.items())
    FAULTS.clear()
    FAULTS.update(ordered)


load_fault_modules(())  # this package's own, in name order


def parse_fault(spec: str, allow_external: bool = False) -> tuple[FaultFn, dict[str, str]]:
    """``NAME[:k=v,...]`` -> (function, keyword arguments as strings). A
    ``module.function`` NAME imports and calls code, so it needs ``allow_external``."""
    name, _, argstr = spec.partition(":")
    kwargs: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in argstr.split(","))):
        key, eq, value = part.partition("=")
        if not eq:
            raise ValueError(f"fault {spec!r}: argument {part!r} is not key=value")
        kwargs[key.strip()] = value.strip()
    if name in FAULTS:
        return FAULTS[name], kwargs
    if "." in name and allow_external:
        module, _, func = name.rpartition(".")
        return getattr(importlib.import_module(module), func), kwargs
    if "." in name:
        raise ValueError(
            f"fault {name!r} is not one of the harness's faults ({', '.join(FAULTS)}); a"
            " module.function fault imports and runs code from outside the harness: pass"
            " --allow-external-faults to allow it"
        )
    raise ValueError(f"unknown fault {name!r}; known: {', '.join(FAULTS)}"
                     " (or a module.function path with --allow-external-faults)")


def env_fault_specs(value: str) -> list[str]:
    """The fault specs of a ``HIL_FAULTS`` value (separated by ";")."""
    return [x.strip() for x in value.split(";") if x.strip()]


# Keys every fault takes, whatever its function: where it is installed (``apply_faults``).
GENERIC_KEYS = ("variant", "stack", "rank")


def check_fault_specs(value: str, allow_external: bool = False) -> None:
    """Raise ValueError for a ``HIL_FAULTS`` value naming a fault not allowed, or giving a
    harness fault a key its function does not take (nothing is imported for a known name; an
    external one is only checked by name here)."""
    for spec in env_fault_specs(value):
        name = spec.partition(":")[0]
        if "." in name and allow_external:
            continue
        _, kwargs = parse_fault(spec, allow_external=False)  # an unknown name raises here
        _check_keys(spec, FAULTS[name], kwargs)
        _rank(spec, kwargs)


def check_fault_spec(spec: str, variants: Collection[str], stacks: Collection[str],
                     allow_external: bool = False) -> None:
    """Raise ValueError, naming what is known, unless ``spec`` would install as written: a
    known fault (or, with ``allow_external``, an importable ``module.function``), each key one
    its function takes or a generic one (``GENERIC_KEYS``), every argument it requires given,
    ``variant=`` one of ``variants``, ``stack=`` one of ``stacks`` and ``rank=`` a rank. Run on the harness side
    before any engine starts: an engine only learns of a typo by installing nothing."""
    fn, kwargs = parse_fault(spec, allow_external=allow_external)
    _check_keys(spec, fn, kwargs)
    variant = kwargs.get("variant")
    if variant is not None and variant not in variants:
        raise ValueError(f"fault {spec!r}: variant={variant!r} is no target variant, so the"
                         f" fault would be installed nowhere; known: {', '.join(variants)}")
    _rank(spec, kwargs)
    stack = kwargs.get("stack")
    if stack is not None and stack not in stacks:
        raise ValueError(f"fault {spec!r}: stack={stack!r} is no stack, so the fault would be"
                         f" installed nowhere; known: {', '.join(stacks)}")


def _rank(spec: str, kwargs: dict[str, str]) -> int | None:
    """The rank ``rank=`` names (None without one); ValueError for one that is no rank."""
    rank = kwargs.get("rank")
    if rank is None:
        return None
    if not (rank.isascii() and rank.isdigit()):  # int() reads '٣' and refuses '²'
        raise ValueError(f"fault {spec!r}: rank={rank!r} is no rank; give a tensor-parallel"
                         " rank, 0 for the first")
    return int(rank)


def check_fault_rank(spec: str, tensor_parallel_sizes: Collection[int]) -> None:
    """Raise ValueError unless ``spec``'s ``rank=`` (if it has one) is a rank of an engine of
    one of ``tensor_parallel_sizes`` (the ranks per engine a run starts): a rank no engine has
    installs the fault nowhere, and the run passes having proved nothing."""
    kwargs = dict(part.strip().partition("=")[::2] for part in spec.partition(":")[2].split(",")
                  if "=" in part)
    rank = _rank(spec, {k.strip(): v.strip() for k, v in kwargs.items()})
    sizes = sorted(set(tensor_parallel_sizes)) or [1]
    if rank is None or rank < sizes[-1]:
        return
    most = sizes[-1]
    ranks = "rank 0 only" if most == 1 else f"ranks 0 to {most - 1}"
    fix = "rank=0" if most == 1 else f"a rank from 0 to {most - 1}"
    raise ValueError(f"fault {spec!r}: rank={rank} is no rank of this run's engines, which run"
                     f" {' or '.join(map(str, sizes))} rank{'s' if most > 1 else ''} each"
                     f" ({ranks}), so the fault would be installed nowhere; give {fix}, or run"
                     " engines of more ranks")


def _check_keys(spec: str, fn: FaultFn, kwargs: dict[str, str]) -> None:
    """Raise ValueError for a key ``fn`` does not take, or an argument it requires and
    ``spec`` lacks (either would be a TypeError in every engine)."""
    try:
        params = list(inspect.signature(fn).parameters.values())[1:]  # after the engine config
    except (TypeError, ValueError):  # a builtin or C function: its keys cannot be known here
        return
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return
    takes = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    name = spec.partition(":")[0]
    if unknown := [k for k in kwargs if k not in takes and k not in GENERIC_KEYS]:
        known = ", ".join(takes + list(GENERIC_KEYS))
        raise ValueError(f"fault {spec!r}: unknown key(s) {', '.join(unknown)}; {name} takes:"
                         f" {known}")
    required = [p.name for p in params if p.default is p.empty and p.name in takes]
    if missing := [k for k in required if k not in kwargs]:
        raise ValueError(f"fault {spec!r}: {name} needs {', '.join(f'{k}=VALUE' for k in missing)}")


def apply_faults(specs: list[str], config: dict[str, Any], rank: int | None = 0,
                 only_ranked: bool = False) -> None:
    """Install every fault in ``specs`` and in ``$HIL_FAULTS`` (separated by ";"; set per
    device in an inventory to simulate a broken card); called before vLLM starts.
    External ``module.function`` faults only with ``$HIL_ALLOW_EXTERNAL_FAULTS=1``, which
    ``--allow-external-faults`` sets. The kinds' fault modules ``config`` names are loaded
    first, so a spec may name any kind's fault.

    ``rank``: the tensor-parallel rank this process is (0: a one-rank engine's process, which
    is rank 0), or None where it is not known yet (a tensor-parallel engine's processes before
    start: ``harness.in_engine.ranks``); a fault naming a rank (``rank=N``) is installed only
    in that rank's process, and ``only_ranked`` installs those alone (a rank learning which
    it is, after start)."""
    load_fault_modules(KindModules.from_config(config).fault_modules)
    allow = os.environ.get(ALLOW_EXTERNAL_ENV, "") not in ("", "0")
    env_specs = env_fault_specs(os.environ.get("HIL_FAULTS", ""))
    for spec in list(specs) + env_specs:
        fn, kwargs = parse_fault(spec, allow_external=allow)
        # And rank=N: installed only in rank N of a tensor-parallel engine (a bug one rank has).
        wanted = kwargs.pop("rank", None)
        if only_ranked and wanted is None:
            continue  # installed before the engine started
        if wanted is not None and rank is None:
            print(f"[hil] fault to be installed in rank {wanted} once it starts: {spec}",
                  flush=True)
            continue
        if wanted is not None and int(wanted) != rank:
            print(f"[hil] fault not installed in rank {rank} (for rank {wanted}): {spec}",
                  flush=True)
            continue
        # Any fault takes variant=ID (spyre-eager-cb, vllm-cpu): installed only in that
        # variant's engines, so one run can prove one fault per target.
        variant = kwargs.pop("variant", None)
        if variant is not None and variant != engine_variant(config):
            print(f"[hil] fault not installed (for {variant}): {spec}", flush=True)
            continue
        # And stack=NAME: installed only in that stack's engines (a bug one stack has).
        stack = kwargs.pop("stack", None)
        if stack is not None and stack != engine_stack(config):
            print(f"[hil] fault not installed (for stack {stack}): {spec}", flush=True)
            continue
        fn(config, **kwargs)
        print(f"[hil] fault installed: {spec}", flush=True)


def engine_stack(config: dict[str, Any]) -> str:
    """The stack of an engine configuration dict (``EngineConfig.stack``; ``default``)."""
    return str(config.get("stack") or "default")


def engine_variant(config: dict[str, Any]) -> str:
    """The variant id of an engine configuration dict (``EngineConfig.variant_id``)."""
    return "-".join(str(config[k]) for k in ("target", "backend", "mode") if config.get(k))
