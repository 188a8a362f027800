"""``hil nightly --explore SECONDS``: the search after the nightly's suites, its input checked
with the nightly's before any suite runs (docs/explore.md), and run only when pytest took the
arguments (they are the search's too)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from harness.explore import command
from harness.explore.command import (
    DEFAULT_MODEL,
    BadInput,
    Search,
    check_search,
    default_cache_dir,
)

PYTEST_REFUSED = 4  # pytest's exit code for arguments it refused (harness.cli.USAGE_ERROR)


def nightly_search(budget: float, args: argparse.Namespace, extra: list[str]) -> Search | int:
    """``hil nightly --explore SECONDS``: the search after the nightly, checked before the
    nightly's suites run: on the first of its stacks, its --target, first --model and
    --inject-fault faults (from its pytest arguments, else their HIL_* variables, else the
    defaults), its inventory, into its reports folder; 2 (said why) when its input is bad."""
    from harness.session.build import BadSetting

    target = _value_of("--target", extra) or os.environ.get("HIL_TARGET", "").strip()
    models = (_value_of("--model", extra) or os.environ.get("HIL_MODEL", "").strip()
              or DEFAULT_MODEL)
    stacks = [s.strip() for s in str(getattr(args, "stacks", "") or "default").split(",")
              if s.strip()]
    try:
        # A seed of the day: each night searches other geometries, a night's search replays.
        return check_search(
            target=target, model=next((m.strip() for m in models.split(",") if m.strip()),
                                      models),
            stack=stacks[0] if stacks else "default",
            faults=_values_of("--inject-fault", extra),
            inventory=getattr(args, "inventory", "") or "", reports_dir=Path(args.reports_dir),
            cache_dir=default_cache_dir(), budget=budget, seed=int(time.strftime("%Y%m%d")))
    except (BadInput, BadSetting) as e:
        print(f"hil nightly --explore: {e}", file=sys.stderr)
        return 2


def search_after_nightly(search: Search, nightly_code: int) -> int:
    """Run a checked nightly search after the nightly's suites ended with ``nightly_code``
    (not after pytest refused the arguments: they are the search's too); the nightly's exit
    code: a finding fails a nightly that passed."""
    from harness.staging.run_folder import ReportsBusy, reports_lock

    if nightly_code == PYTEST_REFUSED:
        print("hil nightly: pytest refused the arguments: the search (--explore) was not run",
              file=sys.stderr)
        return nightly_code
    try:
        with reports_lock(search.info.explore_dir.parent, "hil nightly --explore"):
            explored = command.explore(search)
    except ReportsBusy as e:
        print(f"hil nightly --explore: {e}", file=sys.stderr)
        explored = 2
    return nightly_code or explored


def _values_of(option: str, args: Sequence[str]) -> list[str]:
    """Every value ``args`` give ``option`` (a repeatable one), in order."""
    values = []
    for i, a in enumerate(args):
        if a == option and i + 1 < len(args):
            values.append(args[i + 1])
        elif a.startswith(option + "="):
            values.append(a.split("=", 1)[1])
    return values


def _value_of(option: str, args: Sequence[str]) -> str:
    """The value ``args`` give ``option`` (the last one), or ""."""
    values = _values_of(option, args)
    return values[-1] if values else ""
