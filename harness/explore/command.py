"""``hil explore``: search geometry x workload for a failing example (docs/explore.md).

    hil explore [--target T] [--model M] [--stack S] --budget SECONDS [--seed N]
                [--shrink-budget SECONDS] [--reports-dir DIR] [--cache-dir DIR]
                [--inject-fault FAULT ...] [--inventory FILE] [--engine-timeout SECONDS]

Every target variant ``--target`` names that reads its KV ledgers at every step (default:
every such variant this machine runs) is searched in turn, the budget shared among them; the
first finding ends the search. Writes REPORTS_DIR/explore/findings.md and, per finding, a
regression test beside it. Exit 0: nothing found; 1: a finding (or the search stopped on an
engine or harness error, which the output names); 2: bad input (an unknown target, model,
stack or fault, a budget not above 0, a target this machine cannot run, the reports folder in
use), or no example ran at all (every geometry refused: findings.md says why).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from harness.core.config import ConfigError
from harness.core.paths import REPO_ROOT
from harness.explore.findings import FINDINGS_FILE, FOLDER, RunInfo, write_findings
from harness.plugin.options import add_cli_option, cli_type

SHRINK_BUDGET = 300.0  # seconds of shrinking after the budget, at most (--shrink-budget)
EXPLORE_TIMEOUT = 300.0  # seconds one example's engine call may take (--engine-timeout)
DEFAULT_MODEL = "tiny-llama"
NEEDS = "kv_ledger"  # the capability an explored variant must have: its ledgers every step
CACHE_FOLDER = "explore"  # CACHE_DIR/explore: the example database and the failed geometries


def default_cache_dir() -> Path:
    """The harness cache a run from the checkout uses (HIL_CACHE_DIR, else .hil-cache)."""
    return Path(os.environ.get("HIL_CACHE_DIR", "").strip() or REPO_ROOT / ".hil-cache")


def add_explore_parser(sub: argparse._SubParsersAction, root: Path) -> argparse.ArgumentParser:
    """The ``hil explore`` sub-command."""
    e = sub.add_parser("explore", help="search engine geometry x workload for a failing example"
                       " (hypothesis); findings and regression tests in REPORTS_DIR/explore")
    add_cli_option(e, "--target", help="target variants or kinds to search (as pytest's"
                   " --target; those with per-step KV ledgers); default: every such variant"
                   " this machine runs (env HIL_TARGET)")
    add_cli_option(e, "--model", default=DEFAULT_MODEL,
                   help=f"the model: a tiny model or a local folder (default {DEFAULT_MODEL};"
                   " env HIL_MODEL)")
    add_cli_option(e, "--stack")
    e.add_argument("--budget", type=cli_type("seconds", "--budget"), required=True,
                   help="seconds of search (shrinking a finding comes on top)")
    e.add_argument("--seed", type=cli_type("whole", "--seed"), default=0,
                   help="the seed of the search: the geometries drawn and their workloads"
                   " (default 0)")
    e.add_argument("--shrink-budget", type=cli_type("seconds", "--shrink-budget"),
                   default=SHRINK_BUDGET, help="seconds at most of shrinking a finding"
                   f" (default {SHRINK_BUDGET:g})")
    e.add_argument("--tensor-parallel", type=_sizes, default=(1,), metavar="N[,N]",
                   help="ranks per engine to draw from (default 1; e.g. 1,2: tensor-parallel"
                   " engines too, where the target runs them)")
    add_cli_option(e, "--hil-reports-dir", "--reports-dir", default=str(root / "reports"))
    add_cli_option(e, "--hil-cache-dir", "--cache-dir", default=str(root / ".hil-cache"))
    add_cli_option(e, "--inject-fault")
    add_cli_option(e, "--inventory")
    add_cli_option(e, "--engine-timeout", default=EXPLORE_TIMEOUT,
                   help=f"seconds one example's engine call may take (default"
                   f" {EXPLORE_TIMEOUT:g})")
    e.set_defaults(func=cmd_explore)
    return e


def _sizes(value: str) -> tuple[int, ...]:
    """``--tensor-parallel``'s value: positive whole numbers, comma-separated."""
    try:
        sizes = tuple(dict.fromkeys(int(v) for v in value.split(",") if v.strip()))
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is no list of ranks per engine; give"
                                         " positive whole numbers, e.g. 1,2")
    return sizes


class BadInput(ValueError):
    """Input ``hil explore`` refuses before any engine starts (exit 2)."""


def _search_library() -> None:
    """hypothesis, which the search runs on: part of the default stack (its venv runs ``hil``
    from a checkout); an installed copy on another stack may lack it."""
    try:
        import hypothesis  # noqa: F401
    except ImportError:
        raise BadInput(f"the search needs hypothesis, which {sys.executable} lacks: run hil"
                       " explore from the default stack's venv (./setup.sh), or install it"
                       " there (pip install hypothesis)") from None


def _faults(specs: Sequence[str]) -> tuple[str, ...]:
    """The faults to inject, each checked as the plugin checks them; a HIL_FAULTS in the
    environment is refused (every engine would install it, unnamed)."""
    import pytest

    from harness.in_engine.faults import check_fault_spec
    from harness.plugin.engine_setup import check_no_ambient_faults
    from harness.stacks.host import HOST
    from harness.stacks.spec import list_stacks
    from harness.targets import all_variants

    try:
        check_no_ambient_faults()
    except pytest.UsageError as e:
        raise BadInput(str(e)) from None
    for spec in specs:
        try:
            check_fault_spec(spec, list(all_variants()), [*list_stacks(), HOST])
        except (ValueError, ImportError, AttributeError) as e:
            raise BadInput(f"--inject-fault: {e}") from None
    return tuple(specs)


def _stack(name: str) -> str:
    from harness.stacks.host import HOST, is_unpinned
    from harness.stacks.spec import StackError, load_stack, stack_python

    if name == HOST:
        return name
    try:
        load_stack(name)
    except StackError as e:
        raise BadInput(f"--stack: {e}") from None
    if not is_unpinned(name) and stack_python(name) is None:
        raise BadInput(f"--stack {name}: not installed, or its pins changed since it was"
                       f" installed: run ./setup.sh --stack {name}")
    return name


def _model(value: str) -> str:
    names = [m.strip() for m in value.split(",") if m.strip()]
    if len(names) != 1:
        raise BadInput(f"--model {value!r}: give one model; the search explores one at a time")
    return names[0]


def _variants(spec: str) -> list:
    from harness.targets.variants import select_variants

    try:
        chosen = select_variants(spec)
    except ValueError as e:
        raise BadInput(f"--target: {e}") from None
    # A variant kept for some suites only (vllm-cpu-bf16: token equality) is not searched.
    explorable = [v for v in chosen if NEEDS in v.capabilities and not v.suites]
    if not explorable:
        raise BadInput(f"--target {spec!r} names no target variant whose KV ledgers are read at"
                       f" every step ({', '.join(v.id for v in chosen)}); the search judges each"
                       " example by them: name one that has them (e.g. spyre-eager-cp, vllm-cpu)")
    return explorable


def cmd_explore(args: argparse.Namespace, extra: list[str]) -> int:
    """Run ``hil explore``; its exit code."""
    from harness.staging.interrupt import StopSignals, say_stopped
    from harness.staging.run_folder import ReportsBusy, os_problem, reports_lock

    try:
        _search_library()
        variants = _variants(args.target or "")
        model = _model(args.model)
        stack = _stack(args.stack)
        faults = _faults(args.inject_fault or [])
    except BadInput as e:
        print(f"hil explore: {e}", file=sys.stderr)
        return 2
    # absolute: the engines and their fork server write their logs from folders of their own
    reports = Path(args.reports_dir).absolute()
    info = RunInfo(seed=args.seed, budget=args.budget, shrink_budget=args.shrink_budget,
                   model=model, stack=stack, faults=faults,
                   cache_dir=Path(args.cache_dir).absolute(),
                   explore_dir=reports / FOLDER)
    stop = StopSignals()  # SIGTERM and SIGHUP end the search as Ctrl-C does: engines closed
    try:
        with stop, reports_lock(reports, " ".join(["hil", *sys.argv[1:]])):
            return explore(info, variants, getattr(args, "inventory", "") or "",
                           args.engine_timeout, args.tensor_parallel)
    except KeyboardInterrupt as e:  # the engines closed; what became of findings.md
        return say_stopped("hil explore", e)
    except ReportsBusy as e:
        print(f"hil explore: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"hil explore: {os_problem(e, 'write the findings')}", file=sys.stderr)
        return 2


def explore(info: RunInfo, variants: list, inventory: str = "",
            call_timeout: float = EXPLORE_TIMEOUT,
            tensor_parallel: tuple[int, ...] = (1,)) -> int:
    """Search ``variants`` in turn with ``info``'s budget shared among them; write the
    findings (published only when an example ran: a search of nothing, a refusal or a stop
    leaves the earlier findings.md as it was); 0 nothing found, 1 a finding, 2 nothing
    could run."""
    from harness.staging.staged_report import StagedReport

    with StagedReport(info.explore_dir, "explore", FINDINGS_FILE) as staged:
        results = search(info, variants, inventory, call_timeout, tensor_parallel)
        if isinstance(results, int):
            return results  # refused before any search: nothing written
        tests = write_findings(info, results, into=staged.staging)
        if ran_nothing(results):
            staged.incomplete("no example ran")
        else:
            staged.complete()
    return report(info, results, tests, staged.line)


def search(info: RunInfo, variants: list, inventory: str, call_timeout: float,
           tensor_parallel: tuple[int, ...]) -> list | int:
    """Each usable variant's search result, by target; 2 when none could run (said why)."""
    # deferred: the engines' session and hypothesis, paid only where the search runs
    from harness.explore.runner import ExampleRunner
    from harness.explore.search import Explorer, Identity
    from harness.explore.session import SessionSettings, open_session, usable_variant

    cache_dir = info.cache_dir or default_cache_dir()
    hil = open_session(SessionSettings(
        cache_dir=cache_dir, reports_dir=info.explore_dir,
        stack=info.stack, faults=info.faults, inventory=inventory, call_timeout=call_timeout))
    try:
        try:
            model = hil.model(info.model)
        except (ValueError, ConfigError) as e:
            print(f"hil explore: --model: {e}", file=sys.stderr)
            return 2
        usable = []
        for v in variants:
            ready, why = usable_variant(hil, v, model)
            if ready is None:
                print(f"hil explore: not searched: {v.id}: {why}", flush=True)
            else:
                usable.append(ready)
        if not usable:
            print("hil explore: no target variant named can run here (see above)",
                  file=sys.stderr)
            return 2
        share = info.budget / len(usable)
        print(f"hil explore: {', '.join(v.id for v in usable)} with {model.label} on stack"
              f" {info.stack}, {share:g} s each, seed {info.seed}"
              + (f", faults injected: {', '.join(info.faults)}" if info.faults else ""),
              flush=True)
        results = []
        for v in usable:
            identity = Identity(v.id, model.label, info.stack, info.faults)
            explorer = Explorer(ExampleRunner(hil, model, v, tensor_parallel=tensor_parallel),
                                cache_dir / CACHE_FOLDER,
                                identity, info.seed, share, info.shrink_budget,
                                log=lambda line: print(line, flush=True))
            result = explorer.run()
            results.append((v.id, result))
            if result.findings:
                break
    finally:
        hil.close()
    return results


def ran_nothing(results: list) -> bool:
    """No example ran in any search (every geometry refused, or no time for one): "no
    findings" would then say nothing about the stack."""
    return not any(result.tally.examples for _, result in results)


def report(info: RunInfo, results: list, tests: list[Path], written: str = "") -> int:
    """Print what the search found and did, and ``written``, what became of findings.md
    (``StagedReport.line``); the exit code."""
    for target, result in results:
        t = result.tally
        cost = t.seconds_per_example
        print(f"hil explore: {target}: {t.examples} example(s) in {t.geometries} geometr"
              f"{'y' if t.geometries == 1 else 'ies'} in {result.seconds:.0f} s"
              f" ({'-' if cost is None else f'{cost:.1f} s'} an example),"
              f" {sum(t.rejected.values())} refused, {sum(t.geometries_refused.values())}"
              f" geometries refused; stopped: {result.stopped}", flush=True)
        for f in result.findings:
            print(f"hil explore: finding {f.key}: [check {f.check}] {f.verdict.why}")
            print(f"hil explore: found after {f.found_after:.1f} s, shrunk in"
                  f" {f.shrink_seconds:.1f} s: {f.example.describe()}".replace("\n", "; "))
    if ran_nothing(results) and not tests:
        print("hil explore: no example ran (every geometry refused, or no time for one: this"
              " run's findings.md says why): nothing was searched"
              + (f"; {written}" if written else ""), file=sys.stderr)
        return 2
    print(f"hil explore: {written or info.explore_dir / FINDINGS_FILE}")
    for test in tests:
        print(f"hil explore: regression test {test}")
    return 1 if tests else 0


def nightly_explore(budget: float, args: argparse.Namespace, extra: list[str]) -> int:
    """``hil nightly --explore SECONDS``: the search after the nightly, on the first of its
    stacks, its --target and first --model (from its pytest arguments, else the
    defaults), its inventory, into its reports folder."""
    target = _value_of("--target", extra)
    model = _value_of("--model", extra) or DEFAULT_MODEL
    stacks = [s.strip() for s in str(getattr(args, "stacks", "") or "default").split(",")
              if s.strip()]
    try:
        _search_library()
        variants = _variants(target or "")
        stack = _stack(stacks[0] if stacks else "default")
        name = [m for m in model.split(",") if m.strip()][0].strip()
    except BadInput as e:
        print(f"hil nightly --explore: {e}", file=sys.stderr)
        return 2
    reports = Path(args.reports_dir).absolute()
    # A seed of the day: each night searches other geometries, a night's search replays.
    info = RunInfo(seed=int(time.strftime("%Y%m%d")), budget=budget,
                   shrink_budget=SHRINK_BUDGET, model=name, stack=stack,
                   cache_dir=default_cache_dir(), explore_dir=reports / FOLDER)
    from harness.staging.run_folder import ReportsBusy, reports_lock

    try:
        with reports_lock(reports, "hil nightly --explore"):
            return explore(info, variants, getattr(args, "inventory", "") or "")
    except ReportsBusy as e:
        print(f"hil nightly --explore: {e}", file=sys.stderr)
        return 2


def _value_of(option: str, args: Sequence[str]) -> str:
    """The value ``args`` give ``option`` (the last one), or ""."""
    value = ""
    for i, a in enumerate(args):
        if a == option and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(option + "="):
            value = a.split("=", 1)[1]
    return value
