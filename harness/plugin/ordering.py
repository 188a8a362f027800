"""The order tests run in: by target variant and model, equal engine configurations together;
then this host's shard of them (--shard, planned over the test durations) and the quarantine
(--quarantine) applied.

Files read here that the harness wrote itself (the engine-order record, the default durations
file) are ignored with a warning when unreadable; quarantine entries that match no collected
test are a warning too (refused under --strict-quarantine). The warnings go to pytest's
warnings summary (the workers' too) and to the terminal summary (``file_warnings``)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from fixtures.models import MODEL_SPECS
from harness.engine.order import RECORD, order_tests_by_engine_config
from harness.lab.quarantine import (
    QuarantineCheck,
    apply_quarantine,
    judge_quarantine,
    load_quarantine,
)
from harness.lab.shard import parse_shard, shard_key
from harness.lab.shard_plan import DurationsError, durations_for, group_items, plan_shards
from harness.plugin.invocation import is_worker
from harness.plugin.options import DEFAULT_QUARANTINE, option_value
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
    """Quarantine ``items``; warn of entries that match no collected test (refuse them under
    --strict-quarantine), judged over the whole collection (quarantine.judge_quarantine)."""
    stack = str(option_value(config, "--stack", "default") or "default")
    entries = config.stash.get(QUARANTINE_KEY, [])
    known = [k for k in entries if k.holds_on(stack)]
    elsewhere = [(k, why) for k in entries if (why := k.why_not(stack)) is not None]
    apply_quarantine(items, known)
    if not known and not elsewhere:
        return
    check = judge_quarantine(known, [(i.nodeid, param_ids(i)) for i in
                                     collected_items(config, items)],
                             other_ids=[*VARIANTS, *MODEL_SPECS])
    check.not_judged += elsewhere
    config.stash[QUARANTINE_CHECK_KEY] = check
    if check.unmatched and option_value(config, "--strict-quarantine"):
        refusal = STRICT_REFUSAL + "; ".join(check.warnings())
        if is_worker(config) and items:
            # xdist drops a worker's UsageError unseen: the worker runs nothing and stops the
            # session, which the controller reports with this reason.
            config.hook.pytest_deselected(items=list(items))
            items[0].session.shouldfail = refusal
            items[:] = []
            return
        raise pytest.UsageError(refusal)
    for line in check.warnings():
        warn(config, f"quarantine: {line}", option_value(config, "--quarantine"))


STRICT_REFUSAL = "--strict-quarantine: "


def usage_exit_of_refused_workers(session: pytest.Session) -> None:
    """On an xdist controller whose workers refused their collection under
    --strict-quarantine: the run's exit code is pytest's usage error (4), as without xdist,
    not the interruption (2) xdist ends it with. Nothing changes otherwise."""
    dsession = session.config.pluginmanager.getplugin("dsession")
    reason = str(getattr(dsession, "shouldstop", "") or "")
    if reason.startswith(STRICT_REFUSAL) and session.exitstatus == pytest.ExitCode.INTERRUPTED:
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
