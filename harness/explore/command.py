"""``hil explore``: search geometry x workload for a failing example (docs/explore.md).

    hil explore [--target T] [--model M] [--stack S] --budget SECONDS [--seed N]
                [--shrink-budget SECONDS] [--reports-dir DIR] [--cache-dir DIR]
                [--inject-fault FAULT ...] [--inventory FILE] [--engine-timeout SECONDS]
                [--confirm N]

Every target variant ``--target`` names that reads its KV ledgers at every step (default:
every such variant this machine runs) is searched in turn, the budget shared among them; the
first finding ends the search; it is reported once its shrunk example failed the same way on
--confirm fresh engines (else as flaky). Writes REPORTS_DIR/explore/findings.md and, per
finding, a regression test beside it. Exit 0: nothing found; 1: a finding, confirmed or flaky
(the output says which), or the search stopped on an engine or harness error, which the output
names; 2: bad input (an unknown target, model, stack or fault, a budget not above 0, a
--confirm not a whole number, a quarantine.toml the suites would refuse too, a target this
machine cannot run, tensor-parallel sizes no target runs, a fault's rank no engine has, an
inventory missing or wrong, a bad HIL_* variable, the reports folder in use), or no example ran
at all (every geometry refused: findings.md says why). Every setting of its session is checked
as pytest checks its own: the session is built the one way every session is
(harness.session.build).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.core.config import ConfigError
from harness.core.paths import REPO_ROOT
from harness.explore.confirm import CONFIRM_REPLAYS
from harness.explore.findings import (
    FINDINGS_FILE,
    FOLDER,
    RunInfo,
    console_lines,
    write_findings,
)
from harness.plugin.options import add_cli_option, cli_type

if TYPE_CHECKING:
    from harness.explore.session import CheckedSession

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
    e.add_argument("--confirm", type=cli_type("whole", "--confirm"), default=CONFIRM_REPLAYS,
                   metavar="N", help="replays of a finding's shrunk example, each on a fresh"
                   " engine, that must fail the same way before it is reported as a defect"
                   f" (default {CONFIRM_REPLAYS}, as triage repeats a failure; 0: reported"
                   " unconfirmed)")
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


def _model(value: str) -> str:
    """The one model searched: a tiny model's name, or a local model folder checked as
    pytest checks one (its config, tokenizer and weights)."""
    from fixtures.models import MODEL_SPECS
    from harness.scenario.model_folder import ModelFolderError, check_model_folder

    names = [m.strip() for m in value.split(",") if m.strip()]
    if not names:
        raise BadInput(f"--model {value!r} names no model; give one of: {', '.join(MODEL_SPECS)},"
                       " or a local model folder")
    if len(names) != 1:
        raise BadInput(f"--model {value!r}: give one model; the search explores one at a time")
    name = names[0]
    if name not in MODEL_SPECS:
        if not Path(name).is_dir():
            raise BadInput(f"--model: model folder not found: {name}; pass a local model folder"
                           f" (containing config.json) or one of: {', '.join(MODEL_SPECS)}")
        try:
            check_model_folder(Path(name))
        except ModelFolderError as e:
            raise BadInput(f"--model: {e}") from None
    return name


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


@dataclass(frozen=True)
class Search:
    """A search whose input is checked, before anything is written or started: what it
    searches (its variants, the ranks per engine asked for, some of which one of them runs;
    each variant's own are said when it is searched), how (``info``), and its session's
    settings (``session``)."""

    info: RunInfo
    variants: list
    session: CheckedSession
    tensor_parallel: tuple[int, ...] = (1,)
    known: tuple = ()  # quarantine.toml's entries of explorer verdicts (KnownFailure)


def check_search(*, target: str, model: str, stack: str, faults: Sequence[str],
                 inventory: str, reports_dir: Path, cache_dir: Path, budget: float,
                 seed: int = 0, shrink_budget: float = SHRINK_BUDGET,
                 call_timeout: float = EXPLORE_TIMEOUT,
                 tensor_parallel: tuple[int, ...] = (1,),
                 confirm: int = CONFIRM_REPLAYS) -> Search:
    """``hil explore``'s input (and ``hil nightly --explore``'s) checked: the search library,
    the target, the model, then the session's settings as pytest checks its own (stack,
    faults, inventory, every HIL_* variable: harness.session.build), the ranks per engine
    and a fault's ``rank=`` against them. BadInput or BadSetting name the first bad one."""
    from harness.explore.session import SessionSettings, check_session

    _search_library()
    known = _known()
    variants = _variants(target)
    name = _model(model)
    # absolute: the engines and their fork server write their logs from folders of their own
    reports = reports_dir.absolute()
    session = check_session(SessionSettings(
        cache_dir=cache_dir.absolute(), reports_dir=reports / FOLDER, stack=stack,
        faults=tuple(faults), inventory=inventory, call_timeout=call_timeout))
    sizes = _tensor_parallel(variants, tensor_parallel, stack)
    _fault_ranks(session.opts.faults, sizes)
    info = RunInfo(seed=seed, budget=budget, shrink_budget=shrink_budget, model=name,
                   stack=stack, faults=session.opts.faults, cache_dir=session.opts.cache_dir,
                   explore_dir=reports / FOLDER, confirm=confirm)
    return Search(info, variants, session, tensor_parallel, known)


def _known() -> tuple:
    """The stack's known failures: quarantine.toml's entries of explorer verdicts, read as the
    suites read the file (BadInput naming the file, the entry and the fix)."""
    from harness.explore.known import load_known

    try:
        return load_known()
    except ValueError as e:
        raise BadInput(str(e)) from None


def _tensor_parallel(variants: list, sizes: tuple[int, ...], stack: str) -> tuple[int, ...]:
    """The sizes of ``sizes`` that some of ``variants`` runs here; BadInput naming why when
    none does (a search of other sizes than those asked for would be no answer)."""
    from harness.explore.session import tensor_parallel_sizes

    runs: set[int] = set()
    why: list[str] = []
    for v in variants:
        ok, no = tensor_parallel_sizes(v, sizes, stack)
        runs.update(ok)
        why += [f"{v.id}: {line}" for line in no]
    if not runs:
        raise BadInput(f"--tensor-parallel {','.join(map(str, sizes))}: no target variant"
                       " searched runs an engine of that many ranks here ("
                       + "; ".join(why[:4]) + ("; ..." if len(why) > 4 else "")
                       + "); give sizes the target runs (e.g. 1, or 1,2)")
    return tuple(n for n in sizes if n in runs)


def _fault_ranks(faults: Sequence[str], sizes: tuple[int, ...]) -> None:
    """Refuse a fault whose ``rank=`` no engine of the search has (installed nowhere), as
    pytest refuses one (check_fault_rank)."""
    from harness.in_engine.faults import check_fault_rank

    for spec in faults:
        try:
            check_fault_rank(spec, sizes)
        except ValueError as e:
            raise BadInput(f"--inject-fault: {e} (--tensor-parallel)") from None


def cmd_explore(args: argparse.Namespace, extra: list[str]) -> int:
    """Run ``hil explore``; its exit code."""
    from harness.session.build import BadSetting
    from harness.staging.interrupt import StopSignals, say_stopped
    from harness.staging.run_folder import ReportsBusy, os_problem, reports_lock

    try:
        search = check_search(
            target=args.target or "", model=args.model, stack=args.stack,
            faults=args.inject_fault or [], inventory=getattr(args, "inventory", "") or "",
            reports_dir=Path(args.reports_dir), cache_dir=Path(args.cache_dir),
            budget=args.budget, seed=args.seed, shrink_budget=args.shrink_budget,
            call_timeout=args.engine_timeout, tensor_parallel=args.tensor_parallel,
            confirm=args.confirm)
    except (BadInput, BadSetting) as e:
        print(f"hil explore: {e}", file=sys.stderr)
        return 2
    reports = search.info.explore_dir.parent
    stop = StopSignals()  # SIGTERM and SIGHUP end the search as Ctrl-C does: engines closed
    try:
        with stop, reports_lock(reports, " ".join(["hil", *sys.argv[1:]])):
            return explore(search)
    except KeyboardInterrupt as e:  # the engines closed; what became of findings.md
        return say_stopped("hil explore", e)
    except ReportsBusy as e:
        print(f"hil explore: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"hil explore: {os_problem(e, 'write the findings')}", file=sys.stderr)
        return 2


def explore(search: Search) -> int:
    """Search ``search``'s variants in turn with its budget shared among them; write the
    findings (published only when an example ran: a search of nothing, a refusal or a stop
    leaves the earlier findings.md as it was); 0 nothing found, 1 a finding, 2 nothing
    could run."""
    from harness.staging.staged_report import StagedReport

    info = search.info
    with StagedReport(info.explore_dir, "explore", FINDINGS_FILE) as staged:
        results = run_search(search)
        if isinstance(results, int):
            return results  # refused before any search: nothing written
        tests = write_findings(info, results, into=staged.staging)
        if ran_nothing(results):
            staged.incomplete("no example ran")
        else:
            staged.complete()
    return report(info, results, tests, staged.line)


def run_search(search: Search) -> list | int:
    """Each usable variant's search result, by target; 2 when none could run (said why)."""
    # deferred: the engines' session and hypothesis, paid only where the search runs
    from harness.explore.known import default_file
    from harness.explore.runner import ExampleRunner
    from harness.explore.search import Explorer, Identity
    from harness.explore.session import (
        open_search_session,
        tensor_parallel_sizes,
        usable_variant,
    )

    known = search.known
    info = search.info
    cache_dir = info.cache_dir or default_cache_dir()
    hil = open_search_session(search.session)
    try:
        try:
            model = hil.model(info.model)
        except (ValueError, ConfigError) as e:
            print(f"hil explore: --model: {e}", file=sys.stderr)
            return 2
        usable: list[tuple[Any, tuple[int, ...]]] = []
        refused: list[str] = []
        for v in search.variants:
            ready, why = usable_variant(hil, v, model)
            sizes: tuple[int, ...] = ()
            if ready is not None:
                sizes, no = tensor_parallel_sizes(ready, search.tensor_parallel, info.stack)
                for line in no:  # said once; the sizes it runs are searched
                    print(f"hil explore: {v.id}: {line}: not searched", flush=True)
                why = why or "; ".join(no)
            if ready is None or not sizes:
                refused.append(f"{v.id}: {why}")
                print(f"hil explore: not searched: {v.id}: {why}", flush=True)
            else:
                usable.append((ready, sizes))
        if not usable:
            print("hil explore: no target variant named can run here: "
                  + "; ".join(refused)[:1500], file=sys.stderr)
            return 2
        share = info.budget / len(usable)
        print(f"hil explore: {', '.join(v.id for v, _ in usable)} with {model.label} on stack"
              f" {info.stack}, {share:g} s each, seed {info.seed}"
              + (f", faults injected: {', '.join(info.faults)}" if info.faults else "")
              + f"; {len(known)} known failure(s) of {default_file()}", flush=True)
        results = []
        for v, sizes in usable:
            identity = Identity(v.id, model.label, info.stack, info.faults)
            explorer = Explorer(ExampleRunner(hil, model, v, known=known,
                                              tensor_parallel=sizes),
                                cache_dir / CACHE_FOLDER,
                                identity, info.seed, share, info.shrink_budget,
                                confirm=info.confirm, log=lambda line: print(line, flush=True))
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
            for line in console_lines(f):
                print(f"hil explore: {line}")
    if ran_nothing(results) and not tests:
        print("hil explore: no example ran (every geometry refused, or no time for one: this"
              " run's findings.md says why): nothing was searched"
              + (f"; {written}" if written else ""), file=sys.stderr)
        return 2
    print(f"hil explore: {written or info.explore_dir / FINDINGS_FILE}")
    for test in tests:
        print(f"hil explore: regression test {test}")
    return 1 if tests else 0  # a flaky finding too: said as flaky above, never an all-clear
