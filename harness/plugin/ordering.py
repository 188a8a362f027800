"""The order tests run in: by target variant and model, equal engine configurations together;
then this host's shard of them (--shard, planned over the test durations) and the quarantine
(--quarantine) applied.

Files read here that the harness wrote itself (the engine-order record, the default durations
file) are ignored with a warning when unreadable; quarantine entries that match no test of
the suite are a warning too (refused under --strict-quarantine), judged against the whole
suite, not the selection (deselected tests, and the whole of files named by node ids); an entry
that matches every test is refused. The warnings go to pytest's warnings summary (the workers'
too) and to the terminal summary (``file_warnings``)."""

from __future__ import annotations

import copy
import fnmatch
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from fixtures.models import MODEL_SPECS
from harness.engine.order import RECORD, order_tests_by_engine_config
from harness.lab.quarantine import (
    QuarantineCheck,
    apply_quarantine,
    everything_refusal,
    judge_quarantine,
    load_quarantine,
)
from harness.lab.shard import parse_shard, shard_key
from harness.lab.shard_plan import DurationsError, durations_for, group_items, plan_shards
from harness.plugin.invocation import is_worker
from harness.plugin.options import DEFAULT_QUARANTINE, option_value
from harness.plugin.stack_variants import EMPTIED_KEY, LEFT_OUT_KEY
from harness.stacks.spec import list_stacks
from harness.targets.variants import VARIANTS

SHARD_KEY = pytest.StashKey[object]()
QUARANTINE_KEY = pytest.StashKey[list]()
SHARD_PLAN_KEY = pytest.StashKey[str]()
WARNINGS_KEY = pytest.StashKey[list]()
QUARANTINE_CHECK_KEY = pytest.StashKey[QuarantineCheck]()


class HilFileWarning(pytest.PytestWarning):
    """A file of the harness's own ignored, or a quarantine entry that matches nothing."""


def warn(config: pytest.Config, text: str, source: str | Path) -> None:
    """Say ``text`` in pytest's warnings summary (at the file ``source``) and in the run's
    terminal summary."""
    config.stash.setdefault(WARNINGS_KEY, []).append(text)
    warnings.warn_explicit(HilFileWarning(text), HilFileWarning, str(source), 0)


def file_warnings(config: pytest.Config) -> list[str]:
    """What this process warned about its files and quarantine, in order."""
    stash = getattr(config, "stash", None)  # a stand-in config of a unit test has none
    return list(stash.get(WARNINGS_KEY, [])) if stash is not None else []


def load_shard_and_quarantine(config: pytest.Config) -> None:
    """Parse --shard and read --quarantine (a missing file is an error only when named)."""
    try:
        config.stash[SHARD_KEY] = parse_shard(option_value(config, "--shard"))
        quarantine = str(option_value(config, "--quarantine"))
        config.stash[QUARANTINE_KEY] = load_quarantine(
            Path(quarantine), required=quarantine != str(DEFAULT_QUARANTINE),
            stacks=list_stacks())
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None


def variant_rank(item: pytest.Item) -> tuple[int, str]:
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return (-1, "")
    v = callspec.params.get("target_variant")
    m = callspec.params.get("model", "")
    order = list(VARIANTS)
    # An empty variant selection leaves pytest's NOTSET placeholder here.
    vid = getattr(v, "id", None)
    return (order.index(vid) if vid in VARIANTS else -1, str(m))


def order_items(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Equal engine configurations run together, so each engine starts once (per card: the
    # configurations recorded by earlier runs order the tests within a variant and model).
    items.sort(key=variant_rank)
    cache = Path(option_value(config, "--hil-cache-dir"))
    problem = order_tests_by_engine_config(items, cache, variant_rank)
    if problem:
        warn(config, f"engine order: {problem}", cache / RECORD)


def keep_shard(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep this host's shard of ``items`` (all of them without --shard); deselect the rest."""
    shard = config.stash.get(SHARD_KEY, None)
    if shard is None:
        return
    problems: list[str] = []
    try:
        durations, source = durations_for(option_value(config, "--shard-durations"),
                                          Path(option_value(config, "--hil-reports-dir")),
                                          problems)
    except DurationsError as e:
        raise pytest.UsageError(f"--shard-durations: {e}") from None
    for problem in problems:
        warn(config, f"shard durations: {problem}", source)
    plan = plan_shards(group_items(items, shard_key), shard[1], durations)
    config.stash[SHARD_PLAN_KEY] = f"{plan.fingerprint} (durations: {source})"
    if not is_worker(config):
        print(f"\nshard {shard[0]}/{shard[1]}: {plan.describe()}; durations from {source}")
    keep = [i for i in items if plan.shard_of(shard_key(i)) == shard[0]]
    drop = [i for i in items if plan.shard_of(shard_key(i)) != shard[0]]
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep


def param_ids(item: pytest.Item) -> tuple[str, ...]:
    """The target variant and model ids in ``item``'s node id (what other runs vary)."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    ids = [getattr(params.get("target_variant"), "id", None)]
    if params.get("model") is not None:
        ids.append(Path(str(params["model"])).name)
    return tuple(i for i in ids if isinstance(i, str) and i)


def collected_items(config: pytest.Config, items: list[pytest.Item]) -> list[pytest.Item]:
    """Every test collection produced: ``items`` and those deselected before (-m, -k,
    --shard), which the terminal reporter keeps."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    deselected = list(getattr(reporter, "stats", {}).get("deselected", []))
    return [*items, *(i for i in deselected if isinstance(i, pytest.Item))]


def quarantine(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Quarantine ``items``; warn of entries that match no test of the suite (refuse them
    under --strict-quarantine), and refuse an entry that matches every test, judged over the
    whole suite: deselected tests and the whole of files named by node ids count
    (``whole_suite``; quarantine.judge_quarantine, quarantine.matches_every_test)."""
    stack = str(option_value(config, "--stack", "default") or "default")
    entries = config.stash.get(QUARANTINE_KEY, [])
    known = [k for k in entries if k.holds_on(stack)]
    elsewhere = [(k, why) for k in entries if (why := k.why_not(stack)) is not None]
    apply_quarantine(items, known)
    if not known and not elsewhere:
        return
    whole, unseen = whole_suite(config, items)
    everything = everything_refusal(entries, whole, suite_files(config, items))
    if everything:
        refuse_collection(config, items, EVERYTHING_REFUSAL + everything)
        return
    judged = [k for k in known if k.test.partition("::")[0] not in unseen]
    check = judge_quarantine(judged, whole, other_ids=[*VARIANTS, *MODEL_SPECS])
    check.not_judged += [(k, unseen[k.test.partition("::")[0]]) for k in known
                         if k.test.partition("::")[0] in unseen]
    check.not_judged += elsewhere
    config.stash[QUARANTINE_CHECK_KEY] = check
    if check.unmatched and option_value(config, "--strict-quarantine"):
        refuse_collection(config, items, STRICT_REFUSAL + "; ".join(check.warnings()))
        return
    for line in check.warnings():
        warn(config, f"quarantine: {line}", option_value(config, "--quarantine"))


def refuse_collection(config: pytest.Config, items: list[pytest.Item], refusal: str) -> None:
    """Refuse the run at collection with ``refusal`` (a usage error, exit 4)."""
    if is_worker(config) and items:
        # xdist drops a worker's UsageError unseen: the worker runs nothing and stops the
        # session, which the controller reports with this reason.
        config.hook.pytest_deselected(items=list(items))
        items[0].session.shouldfail = refusal
        items[:] = []
        return
    raise pytest.UsageError(refusal)


STRICT_REFUSAL = "--strict-quarantine: "
EVERYTHING_REFUSAL = "--quarantine: "
REFUSALS = (STRICT_REFUSAL, EVERYTHING_REFUSAL)


def whole_suite(config: pytest.Config, items: list[pytest.Item]
                ) -> tuple[list[tuple[str, tuple[str, ...]]], dict[str, str]]:
    """Every test of the collection as (node id, its variant and model ids): ``items``, those
    deselected (``collected_items``), and all the tests of each file the command line named
    by node ids (``FILE::test``: pytest collected only those). And the file parts whose whole
    could not be collected, with why (their entries are not judged)."""
    tests = {i.nodeid: param_ids(i) for i in collected_items(config, items)}
    unseen: dict[str, str] = {}
    for part, module in narrowed_modules(config, items).items():
        try:
            found = _collect_again(config, module)
        except Exception as e:  # noqa: BLE001 (whatever the module raises, the run goes on)
            unseen[part] = (f"{part} was named by node ids and its other tests could not be"
                            f" collected ({type(e).__name__}: {e})")
            continue
        for item in found:
            tests.setdefault(item.nodeid, param_ids(item))
    return list(tests.items()), unseen


def narrowed_files(config: pytest.Config) -> set[Path]:
    """The files the command line names by node ids (``FILE::test...``), resolved."""
    invocation = getattr(config, "invocation_params", None)
    base = Path(invocation.dir) if invocation is not None else Path.cwd()
    out: set[Path] = set()
    for arg in getattr(config, "args", None) or []:
        path, sep, _ = str(arg).partition("::")
        if sep and path:
            out.add((base / path).resolve())
    return out


def narrowed_modules(config: pytest.Config, items: list[pytest.Item]) -> dict[str, pytest.Module]:
    """The collected modules of the files named by node ids, by their node ids' file part."""
    files = narrowed_files(config)
    modules: dict[str, pytest.Module] = {}
    if not files:
        return modules
    for item in collected_items(config, items):
        path = getattr(item, "path", None)
        if path is None or Path(path).resolve() not in files:
            continue
        module = item.getparent(pytest.Module)
        if module is not None:
            modules.setdefault(item.nodeid.partition("::")[0], module)
    return modules


def _collect_again(config: pytest.Config, module: pytest.Module) -> list[pytest.Item]:
    """Every test of ``module``, collected again without the command line's node ids. Only
    its tests are made (no fixture is registered again); what the stack's collection
    records is kept as it was (the run's own collection says what the stack lacks)."""
    records = (LEFT_OUT_KEY, EMPTIED_KEY)
    saved = {key: copy.copy(config.stash[key]) for key in records if key in config.stash}
    try:
        return list(_tests_of(module))
    finally:
        for key in records:
            if key in saved:
                config.stash[key] = saved[key]
            elif key in config.stash:
                del config.stash[key]


def _tests_of(node: pytest.Collector) -> Iterator[pytest.Item]:
    # A module's and a class's own collect() would register their fixtures again: their
    # collector base makes the tests alone.
    if isinstance(node, pytest.Module):
        children = super(pytest.Module, node).collect()
    elif isinstance(node, pytest.Class):
        children = super(pytest.Class, node).collect()
    else:
        children = node.collect()
    for child in children:
        if isinstance(child, pytest.Item):
            yield child
        elif isinstance(child, pytest.Collector):
            yield from _tests_of(child)


def suite_files(config: pytest.Config, items: list[pytest.Item]) -> list[str]:
    """The test files of the suite, as node ids name them: those of the collected tests'
    folders that pytest's ``python_files`` patterns take (collected or not)."""
    getini = getattr(config, "getini", None)
    patterns = list(getini("python_files")) if getini is not None else ["test_*.py"]
    folders: dict[Path, str] = {}
    for item in collected_items(config, items):
        path = getattr(item, "path", None)
        if path is not None:
            folders.setdefault(Path(path).parent, item.nodeid.partition("::")[0].rpartition("/")[0])
    files: list[str] = []
    for folder, prefix in folders.items():
        try:
            names = sorted(p.name for p in folder.iterdir() if p.is_file())
        except OSError:
            continue
        files += [f"{prefix}/{n}" if prefix else n for n in names
                  if any(fnmatch.fnmatch(n, pattern) for pattern in patterns)]
    return files


def usage_exit_of_refused_workers(session: pytest.Session) -> None:
    """On an xdist controller whose workers refused their collection (--strict-quarantine,
    a quarantine entry of every test): the run's exit code is pytest's usage error (4), as without xdist,
    not the interruption (2) xdist ends it with. Nothing changes otherwise."""
    dsession = session.config.pluginmanager.getplugin("dsession")
    reason = str(getattr(dsession, "shouldstop", "") or "")
    if reason.startswith(REFUSALS) and session.exitstatus == pytest.ExitCode.INTERRUPTED:
        session.exitstatus = pytest.ExitCode.USAGE_ERROR
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:  # the line a refusal without xdist prints
            reporter.write_line(f"ERROR: {reason}", red=True)


def quarantine_notes(config: pytest.Config) -> list[str]:
    """The entries this run could not judge, and why (said with -v)."""
    stash = getattr(config, "stash", None)
    check = stash.get(QUARANTINE_CHECK_KEY, None) if stash is not None else None
    return check.notes() if check is not None else []


def shard_with_plan(config: pytest.Config) -> str:
    """``I/N`` and how the shards were planned (merges compare the plans)."""
    shard = str(option_value(config, "--shard", "") or "")
    plan = config.stash.get(SHARD_PLAN_KEY, "")
    return f"{shard} {plan}" if shard and plan else shard
