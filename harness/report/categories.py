"""Failure categories: why a test failed, from its failure message.

Each category lists regex fragments, each matching the start of one of the
harness's own failure messages (compare.py, preemption.py, kv.py, capacity.py,
engine_host.py, the device fixture) or the name of the exception that carries
it. A fragment must occur in the *first line* of the message, the exception
line Allure records (``AssertionError: token mismatch: ...``): engine errors
append the engine's log tail after it, and log text must not decide a category.

Categories are tried in order and the first that matches wins. So that Allure
(which puts a result in every category it matches) agrees with ``classify``,
each category's regex in categories.json excludes every earlier category with
a negative lookahead. Allure matches a regex against the whole message
(Java ``Matcher.matches``); ``classify`` uses ``re.fullmatch`` on the same
regex, so both read the same file the same way.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FAILED, BROKEN, SKIPPED = "failed", "broken", "skipped"

# What a result that matches no category is counted as in the summary.
UNCLASSIFIED_FAILURE = "unclassified failure"


@dataclass(frozen=True)
class Category:
    """One failure category: a name, what it means, and the messages it claims."""

    name: str
    description: str
    fragments: tuple[str, ...]
    statuses: tuple[str, ...] = (FAILED, BROKEN)

    def own_regex(self) -> str:
        """Matches a first line containing one of the fragments ('' for a catch-all)."""
        if not self.fragments:
            return ""
        return "^[^\\n]*(?:" + "|".join(self.fragments) + ")"


_EXC = r"(?:[\w.]*\.)?"  # an optional module path before an exception class name


def _device_labels() -> str:
    """The leased device kinds' labels (Spyre|Neuron), as the kind registry declares them."""
    from harness.targets import device_kinds

    return "|".join(re.escape(d.label) for d in device_kinds().values() if d.leased)


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
            r"KV cache too small:",
            r"Number of pages available on Spyre",
            _EXC + r"CapacityError:",
        ),
    ),
    Category(
        "recompute",
        "requests were preempted and recomputed, or the full batch the check needs never ran",
        (r"recompute:", r"full batch never reached:"),
    ),
    Category(
        "block leak",
        "a KV-ledger invariant broke: blocks leaked, double-owned or not returned",
        (r"kv invariant \S+ broken at step", r"after warmup: \["),
    ),
    Category(
        "token mismatch",
        "greedy tokens differ from the CPU reference beyond the near-tie rule",
        (r"token mismatch:",),
    ),
    Category(
        "engine crash / harness error",
        "the engine failed to start, died or refused a call, or the harness refused the"
        " configuration",
        (
            r"failed to start with model",
            r"died with exit code",
            r"closed its connection",
            r"connection broken",
            r"is not running \(exit code",
            r"exited with code -?\d+ before connecting",
            r"kv ledger: no KV snapshots",
            _EXC + r"Engine\w*(?:Error|Crashed):",
            _EXC + r"ConfigError:",
        ),
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
        f"(?!{c.own_regex()})" for c in categories[:index] if c.fragments
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


def classify(status: str, message: str | None) -> str | None:
    """The category name of a result with this status and message, as Allure will
    file it; None for a pass, or a failure no category claims."""
    text = message or ""
    for cat, rx in _COMPILED:
        if status in cat.statuses and rx.fullmatch(text):
            return cat.name
    return None


def category_names() -> list[str]:
    """Distinct category names in order."""
    return list(dict.fromkeys(c.name for c in CATEGORIES))
