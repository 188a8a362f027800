"""Failure categories: why a test failed, filed by the check whose verdict failed.

A failed suite expectation raises ``VerdictFailed``, which carries the verdict;
the report records its check name (the ``check`` label of the result) and files
the result by it: each category lists the check families it owns
(``kv_ledger`` owns ``kv_ledger.conservation``) and the exact check names it
owns. Failures that are not verdicts (engine errors, refusals, timeouts, a
missing device) are filed by the exception's class, or by a fragment of the
stack's own refusal text where the stack gives no class to go by.

Allure applies categories.json itself and can only match text, so the regexes
written there match the ``[check NAME]`` tag that ``Verdict.message()`` puts at
the start of every verdict failure, generated from the same check names; and a
fragment must occur in the *first line* (the exception line Allure records):
engine errors append the engine's log tail after it, and log text must not
decide a category. Categories are tried in order and the first that matches
wins; each category's regex excludes every earlier one with a negative
lookahead, so Allure (which files a result under every category that matches)
agrees with ``classify``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.checks.admission import HOLD_BACK, OVERCOMMIT
from harness.checks.distribution import DISTRIBUTION_DISTANCE, DISTRIBUTION_UNRECORDED
from harness.checks.prefix_reuse import PREFIX_REUSE
from harness.checks.tkv import TKV_INVARIANTS
from harness.core import verdict as checks
from harness.targets import capacity_refusals, device_kinds

FAILED, BROKEN, SKIPPED = "failed", "broken", "skipped"

# What a result that matches no category is counted as in the summary.
UNCLASSIFIED_FAILURE = "unclassified failure"


@dataclass(frozen=True)
class Category:
    """One failure category: a name, what it means, the checks and the errors it claims."""

    name: str
    description: str
    fragments: tuple[str, ...] = ()  # regexes for the first line of a non-verdict failure
    statuses: tuple[str, ...] = (FAILED, BROKEN)
    families: tuple[str, ...] = ()  # check families (``kv_ledger`` owns ``kv_ledger.*``)
    checks: tuple[str, ...] = ()  # exact check names, before any family

    def owns_check(self, check: str) -> bool:
        return check in self.checks or (
            check.split(".", 1)[0] in self.families and check not in _EXACT_CHECKS
        )

    def own_regex(self) -> str:
        """Matches a first line with one of the fragments or check tags ('' for a catch-all)."""
        alts = list(self.fragments)
        alts += [r"\[check " + re.escape(c) + r"\]" for c in self.checks]
        if self.families:
            exclude = "".join(f"(?!{re.escape(c)}\\])" for c in sorted(_EXACT_CHECKS))
            fams = "|".join(re.escape(f) for f in self.families)
            alts.append(r"\[check " + exclude + f"(?:{fams})" + r"(?:\.[\w.]+)?\]")
        if not alts:
            return ""
        return "^[^\\n]*(?:" + "|".join(alts) + ")"


_EXC = r"(?:[\w.]*\.)?"  # an optional module path before an exception class name


def _device_labels() -> str:
    """The leased device kinds' labels (Spyre|Neuron), as the kind registry declares them."""
    return "|".join(re.escape(d.label) for d in device_kinds().values() if d.leased)

# Exact check names that belong to another category than their family's.
# The KV-ledger checks of how the scheduler admits, holds back, pauses and serves from its
# prefix cache: nothing leaks, but a limit (free blocks, promises, the batch TKV) is misjudged.
SCHEDULING_CHECKS = (*(f"{checks.KV_LEDGER}.{name}" for name in (*TKV_INVARIANTS, OVERCOMMIT,
                                                                 HOLD_BACK)), PREFIX_REUSE)
_EXACT_CHECKS = frozenset({checks.KV_LEDGER_UNRECORDED, checks.PREEMPTION_UNRECORDED,
                           checks.SELF_CONSISTENCY_UNRECORDED, DISTRIBUTION_UNRECORDED,
                           *SCHEDULING_CHECKS})

CATEGORIES: tuple[Category, ...] = (
    Category(
        "device missing",
        "the device the test needs was not found or not usable (skipped, or failed with"
        " --require-device)",
        (
            r"device required but missing:",
            rf"no (?:usable )?(?:{_device_labels()}) device",
        ),
        (FAILED, BROKEN, SKIPPED),
    ),
    Category(
        "timeout",
        "an engine call or start, or the whole test, took longer than allowed",
        (
            r"gave no answer within",
            r"did not connect within",
            _EXC + r"EngineTimeout:",
            r"Timeout >[\d.]+s",
        ),
    ),
    Category(
        "capacity",
        "the KV block count cannot serve one full-length request",
        (
            # The stacks' own refusals at start (the kinds' capacity_refusal): plain ValueErrors.
            *(re.escape(text) for text in capacity_refusals()),
            _EXC + r"CapacityError:",
        ),
        families=(checks.CAPACITY,),
    ),
    Category(
        "recompute",
        "requests were preempted and recomputed, or the full batch the check needs never ran",
        families=(checks.NO_PREEMPTION, checks.FULL_BATCH, checks.PREEMPTION_SEEN),
    ),
    Category(
        "inherited state",
        "the test ran on an engine an earlier test left dirty that could not be replaced; its"
        " own run broke nothing (the message names the test that left it)",
        checks=(checks.INHERITED_STATE,),
    ),
    Category(
        "scheduling",
        "the scheduler misjudged its own limits: it admitted a request the free blocks could"
        " not hold, held back or paused one it had room for, broke the batch TKV limit or"
        " mispredicted its TKV, or its prefix cache did not serve (or report) what it holds",
        checks=SCHEDULING_CHECKS,
    ),
    Category(
        "block leak",
        "a KV-ledger invariant broke: blocks leaked, double-owned, not returned, promised"
        " wrongly, or the scheduler's pool and the device's KV cache disagree",
        families=(checks.KV_LEDGER, checks.DUMMY_PADDING),
    ),
    Category(
        "token mismatch",
        "greedy tokens differ from the CPU reference beyond the near-tie rule",
        families=(checks.TOKEN_EQUALITY,),
    ),
    Category(
        "logprob drift",
        "the device's logprobs of the tokens it shares with the CPU reference differ beyond the"
        " backend's tolerance (free run or teacher-forced)",
        families=(checks.LOGPROB_CLOSENESS,),
    ),
    Category(
        "distribution drift",
        "the device's distribution over its returned top-k is farther from the CPU reference's"
        " (KL divergence, a lower bound from both top-k tables) than the calibrated noise of"
        " its precision allows",
        families=(DISTRIBUTION_DISTANCE,),
    ),
    Category(
        "sampler not greedy",
        "under greedy sampling the device chose a token that is not the top-1 of its own"
        " returned logprobs: its sampler or argmax did not take the maximum",
        families=(checks.SELF_CONSISTENCY,),
    ),
    Category(
        "engine crash / harness error",
        "the engine failed to start, died or refused a call, or the harness refused the"
        " configuration or recorded nothing to check",
        (
            r"failed to start with model",
            r"died with exit code",
            r"closed its connection",
            r"connection broken",
            r"is not running \(exit code",
            r"exited with code -?\d+ before connecting",
            _EXC + r"Engine\w*(?:Error|Crashed):",
            _EXC + r"ConfigError:",
        ),
        checks=(checks.KV_LEDGER_UNRECORDED, checks.PREEMPTION_UNRECORDED,
                checks.SELF_CONSISTENCY_UNRECORDED, DISTRIBUTION_UNRECORDED),
    ),
    # Any other exception than an assertion is the harness's or the stack's error.
    Category(
        "engine crash / harness error",
        "an unexpected exception in the harness or the stack",
        (),
        (BROKEN,),
    ),
)


def category_regex(index: int, categories: tuple[Category, ...] = CATEGORIES) -> str:
    """The full-match regex of ``categories[index]``, excluding every earlier category."""
    guards = "".join(
        f"(?!{c.own_regex()})" for c in categories[:index] if c.own_regex()
    )
    own = categories[index].own_regex()
    return f"(?s){guards}{own}.*"


def categories_json(categories: tuple[Category, ...] = CATEGORIES) -> list[dict[str, Any]]:
    """The content of Allure's categories.json."""
    return [
        {
            "name": c.name,
            "description": c.description,
            "matchedStatuses": list(c.statuses),
            "messageRegex": category_regex(i, categories),
        }
        for i, c in enumerate(categories)
    ]


def write_categories(results_dir: Path) -> Path:
    path = Path(results_dir) / "categories.json"
    path.write_text(json.dumps(categories_json(), indent=1))
    return path


_COMPILED: list[tuple[Category, re.Pattern[str]]] = [
    (c, re.compile(category_regex(i))) for i, c in enumerate(CATEGORIES)
]


def category_of_check(status: str, check: str) -> str | None:
    """The category that owns the failed check ``check`` (None: no category does)."""
    for cat in CATEGORIES:
        if status in cat.statuses and cat.owns_check(check):
            return cat.name
    return None


def classify(status: str, message: str | None, check: str | None = None) -> str | None:
    """The category name of a result: by the failing verdict's ``check`` when the result
    records one, else as Allure files its message; None for a pass, or a failure no
    category claims."""
    if check:
        return category_of_check(status, check)
    text = message or ""
    for cat, rx in _COMPILED:
        if status in cat.statuses and rx.fullmatch(text):
            return cat.name
    return None


def category_names() -> list[str]:
    """Distinct category names in order."""
    return list(dict.fromkeys(c.name for c in CATEGORIES))
