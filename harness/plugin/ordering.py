"""The order tests run in: by target variant and model, equal engine configurations together;
then this host's shard of them (--shard, planned over the test durations) and the quarantine
(--quarantine) applied."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.engine.order import order_tests_by_engine_config
from harness.lab.quarantine import apply_quarantine, load_quarantine
from harness.lab.shard import parse_shard, shard_key
from harness.lab.shard_plan import DurationsError, durations_for, group_items, plan_shards
from harness.plugin.invocation import is_worker
from harness.plugin.options import DEFAULT_QUARANTINE, option_value
from harness.targets.variants import VARIANTS

SHARD_KEY = pytest.StashKey[object]()
QUARANTINE_KEY = pytest.StashKey[list]()
SHARD_PLAN_KEY = pytest.StashKey[str]()


def load_shard_and_quarantine(config: pytest.Config) -> None:
    """Parse --shard and read --quarantine (a missing file is an error only when named)."""
    try:
        config.stash[SHARD_KEY] = parse_shard(option_value(config, "--shard"))
        quarantine = str(option_value(config, "--quarantine"))
        config.stash[QUARANTINE_KEY] = load_quarantine(
            Path(quarantine), required=quarantine != str(DEFAULT_QUARANTINE))
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
    order_tests_by_engine_config(items, Path(option_value(config, "--hil-cache-dir")), variant_rank)


def keep_shard(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep this host's shard of ``items`` (all of them without --shard); deselect the rest."""
    shard = config.stash.get(SHARD_KEY, None)
    if shard is None:
        return
    try:
        durations, source = durations_for(option_value(config, "--shard-durations"),
                                          Path(option_value(config, "--hil-reports-dir")))
    except DurationsError as e:
        raise pytest.UsageError(f"--shard-durations: {e}") from None
    plan = plan_shards(group_items(items, shard_key), shard[1], durations)
    config.stash[SHARD_PLAN_KEY] = f"{plan.fingerprint} (durations: {source})"
    if not is_worker(config):
        print(f"\nshard {shard[0]}/{shard[1]}: {plan.describe()}; durations from {source}")
    keep = [i for i in items if plan.shard_of(shard_key(i)) == shard[0]]
    drop = [i for i in items if plan.shard_of(shard_key(i)) != shard[0]]
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep


def quarantine(config: pytest.Config, items: list[pytest.Item]) -> None:
    apply_quarantine(items, config.stash.get(QUARANTINE_KEY, []))


def shard_with_plan(config: pytest.Config) -> str:
    """``I/N`` and how the shards were planned (merges compare the plans)."""
    shard = str(option_value(config, "--shard", "") or "")
    plan = config.stash.get(SHARD_PLAN_KEY, "")
    return f"{shard} {plan}" if shard and plan else shard
