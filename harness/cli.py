"""The ``hil`` command.

    hil run [--stacks A,B] [PYTEST ARGS...]
                               the main job: every suite against what this machine has,
                               writing reports/junit.xml and reports/allure-results (they
                               replace the previous ones only when the run completed; an
                               interrupted run is kept in reports/interrupted-<time>/)
    hil suites [PYTEST ARGS...] the suites of this copy (an installed one's too) in a pytest run
                               from this folder, outputs here: what a card host runs
    hil nightly [--shard I/N] [--inventory FILE] [--explore SECONDS] [PYTEST ARGS...]
                               the nightly selection on this host's device kinds, devices
                               required, exit code 0 only when every selected test passed;
                               with --explore, hil explore after it for that long
    hil devices [--inventory FILE]
                               what discovery (or the inventory) found, and why not
    hil bench [--quick] [--parts P,..]  what a run costs: the benchmark of the harness itself
    hil models [NAME...]       verify the tiny offline models (build or rebuild them) and
                               print their folders
    hil report [--serve]       reports/allure-results -> reports/allure-report (static HTML,
                               with the previous report's history), and reports/summary.md;
                               --output only a new folder or a report it wrote
    hil report SOURCE...       merge shard results (folders or .tar.gz/.zip) into one report
    hil selftest               inject each harness fault into this host's stack: caught?
    hil triage NODEID [--budget S] [PYTEST ARGS...]
                               re-run one test of the last run with triage on (its stack and
                               options as recorded), into reports/triage/<time>-<test>/, and
                               print what its failure depends on
    hil calibrate [--model M] [--precision fp16,bf16]
                               measure half-precision noise against fp32 (teacher-forced) per
                               model and precision; thresholds cached, reports/calibration.md
    hil explore --budget SECONDS [--target T] [--seed N] [--model M] [--stack S]
                               search engine geometry x workload for a failing example
                               (hypothesis): reports/explore/findings.md and a regression test
                               per finding; exit 0 nothing found, 1 a finding
"""

# ruff: noqa: E402 (the stop handlers come before the heavy imports)
from __future__ import annotations

from harness.staging.starting import quiet_start

quiet_start(__name__)  # as the hil command: a stop while the imports below run ends it quietly

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from harness.calibration.command import add_calibrate_parser
from harness.core.paths import REPO_ROOT, SUITES_DIR
from harness.explore.command import add_explore_parser
from harness.explore.nightly import nightly_search, search_after_nightly
from harness.in_engine.kind_modules import resolve
from harness.lab.inventory import Inventory, InventoryError, discover_inventory, load_inventory
from harness.lab_merge.lab_report import keep_durations, merge_command, source_inputs
from harness.plugin.option_needs import (
    COMMAND_NEEDS,
    on_command_line,
    owned_refusal,
    refusal,
    unmet,
)
from harness.plugin.options import add_cli_option, cli_env_problem, cli_type
from harness.report.generate import report_command, serve_report
from harness.report.report_output import output_problem
from harness.report.stack_summary import junit_name, save_stack_part
from harness.selftest import add_selftest_parser
from harness.stacks.spec import StackError, list_stacks, load_stack
from harness.staging.interrupt import (
    ChildRunner,
    StopSignals,
    pytest_command,
    say_stopped,
    script_command,
    signal_name,
)
from harness.staging.run_folder import (
    ReportsBusy,
    new_staging,
    os_problem,
    reports_lock,
    tidy_leftovers,
)
from harness.staging.staged_run import (
    StagedRun,
    after_os_error,
    durations_args,
    finish,
    sharded,
)
from harness.targets import KINDS, all_variants, device_kinds, nightly_markers
from harness.triage_command import add_triage_parser

ROOT = REPO_ROOT


# The suites `hil run` runs (a seam: tests point it at a small suite of their own).
RUN_SUITES = ROOT / "suites"


def cmd_run(args: argparse.Namespace, extra: list[str]) -> int:
    reports = Path(args.reports_dir)
    stacks = [x.strip() for x in getattr(args, "stacks", "default").split(",") if x.strip()]
    problem = stacks_problem(getattr(args, "stacks", "default"), stacks)
    if problem:
        # Refused before anything is touched: the previous results and report stay.
        print(f"hil run: {problem}", file=sys.stderr)
        return 2
    run: StagedRun | None = None
    try:
        # The runner's handlers from the start: a stop while the folder is prepared is a
        # stop of the run (no child starts), ended by finish() as any other.
        with ChildRunner() as runner, reports_lock(reports, " ".join(["hil", *sys.argv[1:]])):
            for line in tidy_leftovers(reports):
                print(f"hil run: {line}", file=sys.stderr)
            run = StagedRun(reports, new_staging(reports), stacks)
            # The published durations plan shards; an unsharded run takes none.
            durations = durations_args(reports, args, extra) if sharded(args, extra) else []
            _run_stacks(runner, run, durations + extra)
            run.signal = runner.signal
            code, lines = finish(run)
    except ReportsBusy as e:
        print(f"hil run: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"hil run: {os_problem(e, 'write the results')}; {after_os_error(run, reports)}",
              file=sys.stderr)
        return 1 if run is not None and 1 in run.codes else 2
    published = run is not None and run.published
    for line in lines:
        print(line, file=sys.stdout if published else sys.stderr, flush=True)
    return code


def _run_stacks(runner: ChildRunner, run: StagedRun, extra: list[str]) -> None:
    """One pytest run per stack, all into the run's staging folder: one report, side by
    side. A refused first run or a signal ends the run."""
    for stack in run.stacks:
        cmd = pytest_command(str(RUN_SUITES), f"--alluredir={run.results}",
                             f"--junitxml={run.staging / junit_name(stack)}",
                             f"--hil-reports-dir={run.staging}", f"--stack={stack}", *extra)
        print("hil run: pytest", " ".join(cmd[3:]), flush=True)
        outcome = runner.run(cmd, ROOT)
        run.codes.append(outcome.code)
        if outcome.code == USAGE_ERROR and len(run.codes) == 1:
            return
        # Each run empties STAGING/stats: keep this stack's statistics and summary part.
        save_stack_part(run.staging, run.results, stack, outcome.code,
                        ran=outcome.code != USAGE_ERROR)
        if outcome.signal:
            return


USAGE_ERROR = 4  # pytest's exit code for arguments it refused


def suites_command(extra: list[str], here: Path) -> list[str]:
    """The pytest command of ``hil suites`` run in ``here``: the plugin asked for (-p vllm_hil),
    the suites of this copy with their folder's parent as rootdir (node ids
    ``suites/test_*.py::...`` as in a checkout), configured by ``here``'s pytest.ini alone (no
    ini, conftest or cache of the folders the suites are installed in)."""
    ini = here / "pytest.ini"
    return pytest_command("-p", "vllm_hil",
            "-c", str(ini) if ini.is_file() else os.devnull,
            f"--rootdir={SUITES_DIR.parent}", f"--confcutdir={SUITES_DIR}",
            "-o", f"cache_dir={here / '.pytest_cache'}", str(SUITES_DIR), *extra)


def cmd_suites(args: argparse.Namespace, extra: list[str]) -> int:
    if not SUITES_DIR.is_dir():
        print(f"hil suites: no suites in {SUITES_DIR}; install the harness with pip (not only"
              " its packages) or run from a checkout", file=sys.stderr)
        return 2
    cmd = suites_command(extra, Path.cwd())
    print("hil suites: pytest", " ".join(cmd[3:]), flush=True)
    with ChildRunner() as runner:
        return runner.run(cmd, Path.cwd()).exit_code


def stacks_problem(value: str, stacks: list[str]) -> str | None:
    """Why ``--stacks value`` cannot run, or None."""
    if not stacks:
        return (f"--stacks {value!r} names no stack; name one or more of: {list_stacks()}"
                " (or leave the option out for the default stack)")
    for name in stacks:
        try:
            load_stack(name)
        except StackError as e:
            return f"--stacks: {e}"
    return None


def cmd_report(args: argparse.Namespace, extra: list[str]) -> int:
    reports = Path(args.reports_dir)
    output = Path(args.output or reports / "allure-report")
    results = Path(args.results or reports / "allure-results")
    if args.sources:
        inputs = [*source_inputs(args.sources), ("the merged results", reports / "merged-results")]
    elif not results.is_dir():
        print(f"hil report: --results {results}: no such results folder; pass the allure-results"
              " folder of a run (or run `hil run` first). Nothing was changed", file=sys.stderr)
        return 2
    else:
        inputs = [("the results folder", results)]
    problem = output_problem(output, reports, inputs)
    if problem:
        print(f"hil report: {problem}", file=sys.stderr)
        return 2
    try:
        with reports_lock(reports, " ".join(["hil", *sys.argv[1:]])):
            rc = _make_report(args, reports, results, output)
    except ReportsBusy as e:
        print(f"hil report: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"hil report: {os_problem(e, 'write the report')}; the previous report is kept",
              file=sys.stderr)
        return 2
    if rc == 0 and args.serve:
        serve_report(output, args.port)  # outside the lock: serving may last all day
    return rc


def _make_report(args: argparse.Namespace, reports: Path, results: Path, output: Path) -> int:
    if args.sources:
        return merge_command(args.sources, reports, output, reports / "summary.md",
                             history=not args.no_history)
    keep_durations(results, reports)
    return report_command(results, output, reports / "summary.md", history=not args.no_history)


def nightly_selection(devices: list[Any]) -> str:
    """The marker expression of a nightly on a host with these inventory devices."""
    return f"nightly and ({' or '.join(nightly_markers(devices))})"


def cmd_nightly(args: argparse.Namespace, extra: list[str]) -> int:
    try:
        inv = load_inventory(Path(args.inventory)) if args.inventory else discover_inventory()
    except InventoryError as e:
        print(f"hil nightly: {e}", file=sys.stderr)
        return 2
    search = nightly_search(args.explore, args, extra) if args.explore else None  # checked first
    if isinstance(search, int):
        return search
    selection = nightly_selection(inv.devices)
    print(f"hil nightly: devices from {inv.source}: {', '.join(d.id for d in inv.devices)};"
          f" selection: {selection}", flush=True)
    pytest_args = ["-m", selection, "--require-device"]
    if args.shard:
        pytest_args.append(f"--shard={args.shard}")
    if args.shard_durations:
        pytest_args.append(f"--shard-durations={args.shard_durations}")
    if args.inventory:
        pytest_args.append(f"--inventory={args.inventory}")
    rc = cmd_run(args, pytest_args + extra)
    if rc == 5:
        print("hil nightly: no test was selected; that is a failure", file=sys.stderr)
        rc = 1
    if search is not None and rc < 128:  # not after a signal (128 + it): it stops the nightly
        rc = search_after_nightly(search, rc)
    return rc


def cmd_devices(args: argparse.Namespace, extra: list[str]) -> int:
    if args.inventory:
        try:
            inv = load_inventory(Path(args.inventory), Path(args.root))
        except InventoryError as e:
            print(f"hil devices: {e}", file=sys.stderr)
            return 2
        print(f"inventory {inv.source}: {len(inv.devices)} device(s)")
        for d in inv.devices:
            state = "usable" if d.usable else f"UNUSABLE: {d.why_unusable()}"
            print(f"  {d.id}: {d.kind} {d.backend or ''} {state}")
        _print_groups(inv)
        return _print_stacks(inv)
    root = Path(args.root)
    scans = [dk.discover(root) for dk in device_kinds().values() if dk.discover is not None]
    for scan in scans:
        print(f"{scan.kind}: {len(scan.usable)} usable of {len(scan.devices)} found"
              f" (looked for {scan.looked_for})")
        for d in scan.devices:
            print(f"  {d.id} {'usable' if d.usable else 'UNUSABLE'}: {d.detail}")
        why = scan.why_none()
        if why:
            print(f"  {why}")
    on_cpu = dict.fromkeys(" ".join(filter(None, (v.target, v.backend)))
                           for v in all_variants().values() if v.platform_marker == "cpu")
    print(f"cpu: always available ({', '.join(on_cpu)})")

    # What each kind's runs need besides the device (an SDK, a stack of their own).
    for k in KINDS.values():
        for line in k.host_lines():
            print(line)

    return _print_stacks(discover_inventory(root))


def _print_groups(inv: Inventory) -> None:
    """The groups a tensor-parallel engine leases: declared, else formed from free devices."""
    if inv.groups:
        print("groups (a tensor-parallel engine leases one whole; rank i on its i-th device):")
        for g in inv.groups:
            state = "usable" if g.usable else f"UNUSABLE: {g.why_unusable()}"
            print(f"  {g.id}: TP {len(g.members)} on {', '.join(g.cards)} {state}")
        return
    leased = [d for d in inv.devices if d.leased and d.usable]
    if len(leased) > 1:
        print(f"groups: none declared; an engine of N ranks leases the first N free devices"
              f" that serve it, in address order (up to {len(leased)} here)")


def _print_stacks(inv: object) -> int:
    """Each kind's stack report for its devices (for a card: stack, torch_sendnn, card env); 1
    when devices are listed but the stack cannot drive them, so a lab's pre-flight fails before
    any engine starts."""
    ok = True
    for k in KINDS.values():
        lines, kind_ok = k.stack_lines(inv)
        for line in lines:
            print(line)
        ok = ok and kind_ok
    return 0 if ok else 1


def cmd_bench(args: argparse.Namespace, extra: list[str]) -> int:
    cmd = script_command(ROOT / "bench" / "harness_bench.py", *(["--quick"] if args.quick else []),
                         *(["--parts", args.parts] if args.parts else []))
    # The bench imports the checkout's fixtures and harness; non-zero when a timed run failed.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    with ChildRunner() as runner:  # stopped, the bench says what it kept (exit 128 + signal)
        outcome = runner.run(cmd, ROOT, env=env)
    if outcome.signal and outcome.code == 2:  # stopped before the bench began: it said nothing
        print(f"hil bench: stopped by {signal_name(outcome.signal)} while starting; nothing of"
              " this run was written", file=sys.stderr)
    return outcome.exit_code


def cmd_models(args: argparse.Namespace, extra: list[str]) -> int:
    """Per model one line: verified, built or rebuilt (and what was wrong), and its folder; a
    folder that could not be rebuilt is reported damaged, exit 1."""
    # deferred: a heavy import, paid only where this runs
    from fixtures.model_hash import manifest_problems
    from fixtures.models import MODEL_SPECS, ensure_model, model_dir_for

    unknown = [n for n in args.names if n not in MODEL_SPECS]
    if unknown:
        print(f"hil models: unknown tiny model {', '.join(map(repr, unknown))}; known:"
              f" {', '.join(MODEL_SPECS)}", file=sys.stderr)
        return 2
    failed = False
    for name in args.names or list(MODEL_SPECS):
        try:
            print(ensure_model(name, Path(args.cache_dir)).line(), flush=True)
        except (OSError, RuntimeError, ValueError) as e:
            folder = model_dir_for(name, Path(args.cache_dir))
            problems = "; ".join(manifest_problems(folder))
            print(f"{name} damaged ({problems}; the rebuild failed: {e}) {folder}", flush=True)
            failed = True
    return 1 if failed else 0


def _shared(parser: argparse.ArgumentParser, *names: str) -> None:
    """The arguments ``hil`` commands share with pytest, declared by harness/plugin/options.py:
    the same types, checks and HIL_* variables (``--reports-dir`` is pytest's
    ``--hil-reports-dir``, with the checkout's reports folder as default)."""
    for name in names:
        if name == "--reports-dir":
            add_cli_option(parser, "--hil-reports-dir", "--reports-dir",
                           default=str(ROOT / "reports"))
        elif name == "--stacks":
            add_cli_option(parser, "--stack", "--stacks", help="comma-separated stacks"
                           " (stacks/NAME.toml) to run, one report for all (env HIL_STACK)")
        else:
            add_cli_option(parser, name)


def build_parser() -> argparse.ArgumentParser:
    """The ``hil`` command's parser, every sub-command's arguments declared."""
    p = argparse.ArgumentParser(prog="hil", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the suites and write reports (extra args go to pytest)")
    _shared(r, "--reports-dir", "--stacks")
    r.set_defaults(func=cmd_run)
    s = sub.add_parser("suites", help="run the suites from this folder, outputs here (extra args"
                       " go to pytest)")
    s.set_defaults(func=cmd_suites)
    n = sub.add_parser("nightly", help="the nightly: devices required, shardable")
    _shared(n, "--reports-dir", "--shard", "--inventory", "--shard-durations", "--stacks")
    n.add_argument("--explore", type=cli_type("seconds", "--explore"), default=None,
                   metavar="SECONDS", help="then search geometry x workload for that long"
                   " (hil explore; REPORTS_DIR/explore)")
    n.set_defaults(func=cmd_nightly)
    d = sub.add_parser("devices", help="print discovered devices")
    add_cli_option(d, "--device-root", "--root", default="/",
                   help="filesystem root to scan (a fake card host; env HIL_DEVICE_ROOT;"
                   " default /)")
    add_cli_option(d, "--inventory", help="an inventory file to check instead (env HIL_INVENTORY)")
    d.set_defaults(func=cmd_devices)
    rp = sub.add_parser("report", help="make the HTML report of the last run (offline)")
    _shared(rp, "--reports-dir")
    rp.add_argument("sources", nargs="*", metavar="SOURCE",
                    help="shard results to merge (reports or allure-results folders, or"
                    " .tar.gz/.zip of them); default: REPORTS_DIR/allure-results alone")
    rp.add_argument("--results", default="", help="default: REPORTS_DIR/allure-results")
    rp.add_argument("--output", default="", help="default: REPORTS_DIR/allure-report")
    rp.add_argument("--no-history", action="store_true",
                    help="start the trends afresh instead of carrying the previous report's")
    rp.add_argument("--serve", action="store_true",
                    help="then serve the report on http://127.0.0.1:PORT until Ctrl-C")
    rp.add_argument("--port", type=cli_type("port", "--port"), default=0,
                    help="0 to 65535 (default 0: any free port)")
    rp.set_defaults(func=cmd_report)

    add_selftest_parser(sub, ROOT)
    add_triage_parser(sub, ROOT)
    add_explore_parser(sub, ROOT)
    b = sub.add_parser("bench", help="benchmark the harness itself (bench/harness_bench.py)")
    b.add_argument("--quick", action="store_true")
    b.add_argument("--parts", default="", help="comma-separated parts of the bench (default all)")
    b.set_defaults(func=cmd_bench)
    m = sub.add_parser("models", help="verify the tiny offline models against their build"
                       " manifests, building or rebuilding them")
    m.add_argument("names", nargs="*")
    add_cli_option(m, "--hil-cache-dir", "--cache-dir", default=str(ROOT / ".hil-cache"))
    m.set_defaults(func=cmd_models)
    for k in KINDS.values():  # the kinds' own commands (the Spyre plugin's registry)
        for ref in k.commands.values():
            resolve(ref)(sub, ROOT)
    c = add_calibrate_parser(sub)
    add_cli_option(c, "--hil-cache-dir", "--cache-dir", default=str(ROOT / ".hil-cache"))
    _shared(c, "--reports-dir")
    return p


def subcommand_parsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser of each ``hil`` sub-command, by name."""
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def needs_problem(parser: argparse.ArgumentParser, cmd: str, args: argparse.Namespace,
                  argv: list[str], extra: list[str]) -> str | None:
    """Why the arguments of ``hil cmd`` cannot run as given: an option given without the one
    it only means something beside (option_needs.COMMAND_NEEDS), or a pytest option among
    ``extra`` the command sets itself (option_needs.WRAPPER_OWNS); None when they can."""
    values: dict[str, Any] = {}
    defaults: dict[str, Any] = {}
    variables: dict[str, str | None] = {}
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        key = (action.option_strings[-1] if action.option_strings
               else str(action.metavar or action.dest))
        values[key] = getattr(args, action.dest, None)
        defaults[key] = getattr(action, "hil_declared_default", action.default)
        variables[key] = getattr(action, "hil_env", None)
    for need in unmet(COMMAND_NEEDS.get(cmd, ()), values, defaults):
        variable = variables.get(need.option)
        from_env = (variable and os.environ.get(variable, "").strip()
                    and not on_command_line(need.option, argv))
        return refusal(need, values, variable if from_env else None)
    return owned_refusal(cmd, extra)


def main(argv: list[str] | None = None) -> int:
    """Run the ``hil`` command ``argv``; its exit code. A stop signal (SIGINT, SIGTERM,
    SIGHUP) in a command that has no handling of its own ends it with one line (what became
    of its report) and 128 + the signal."""
    argv = sys.argv[1:] if argv is None else list(argv)
    with StopSignals():
        try:
            return _main(argv)
        except KeyboardInterrupt as e:
            return say_stopped(" ".join(["hil", *[a for a in argv[:1] if a[:1] != "-"]]), e)


def _main(argv: list[str]) -> int:
    p = build_parser()
    args, extra = p.parse_known_args(argv)
    if args.cmd not in ("run", "nightly", "suites", "triage") and extra:
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    problem = cli_env_problem(args) or needs_problem(
        subcommand_parsers(p)[args.cmd], args.cmd, args, argv, extra)
    if problem:
        print(f"hil {args.cmd}: {problem}", file=sys.stderr)
        return 2
    return int(args.func(args, extra))


if __name__ == "__main__":
    sys.exit(main())
