"""Merging the results of several shards (hosts) into one results folder for one report.

Each source is a shard's reports folder, its allure-results folder, or a .tar.gz/.tgz/
.zip archive of either. The merge copies every readable result, container and
attachment into one folder (the sources are never changed) and says what a reviewer of
a lab nightly must know: shards missing (from each shard's recorded ``run.shard`` I/N),
a shard present twice, tests run twice, shards that planned the split differently, and
shards that ran on a different stack or harness version than the others.
"""

from __future__ import annotations

import os
import re
import shutil
import tarfile
import tempfile
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.report.categories import write_categories
from harness.report.report_output import swap_in
from harness.report.results import ResultsFolder, labels_of, load_results, params_of
from harness.report.run_config import format_properties, read_properties
from harness.targets import stack_distributions

ARCHIVES = (".tar.gz", ".tgz", ".zip")
# environment.properties keys that must agree between shards of one nightly (the kinds' plugins
# as the kinds declare them).
SAME_STACK = ("vllm-hil commit", "torch", "vLLM", "vLLM (upstream)",
              *(label for label, _ in stack_distributions()), "transformers", "ibm-fms", "python")
SHARD_RX = re.compile(r"^\s*(\d+)/(\d+)\s*(.*)$")


class MergeError(ValueError):
    """A source that cannot be merged at all (not found, not an archive we can read)."""


@dataclass
class Source:
    """One shard's results as found."""

    given: str
    results: Path
    props: dict[str, str]
    shard: tuple[int, int] | None
    plan: str
    tests: int = 0

    @property
    def name(self) -> str:
        host = self.props.get("host", "?")
        return f"shard {self.shard[0]}/{self.shard[1]} ({host})" if self.shard else f"{self.given} ({host})"


@dataclass
class Merged:
    """The merged folder and what the merge found."""

    folder: Path
    sources: list[Source] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    complete: bool = True  # every shard 1..N present once, no other problem with shards


def _safe_extract(archive: Path, into: Path) -> None:
    """Extract without letting a member escape ``into`` (absolute paths, .., links)."""
    into = into.resolve()
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as z:
            for member in z.namelist():
                if not (into / member).resolve().is_relative_to(into):
                    raise MergeError(f"{archive}: member {member!r} would be written outside"
                                     " the extraction folder; refusing the archive")
            z.extractall(into)
        return
    with tarfile.open(archive, "r:*") as t:
        t.extractall(into, filter="data")


def find_results(root: Path) -> Path | None:
    """The allure-results folder in ``root``: itself, root/allure-results, or one found
    below (archives often keep a reports/ prefix)."""
    def holds(p: Path) -> bool:
        return (p / "environment.properties").is_file() or any(p.glob("*-result.json"))

    if holds(root):
        return root
    if (root / "allure-results").is_dir():
        return root / "allure-results"
    found = sorted(p for p in root.rglob("allure-results") if p.is_dir())
    return found[0] if found else None


def open_source(given: str, scratch: Path) -> Source:
    """Locate (extracting archives into ``scratch``) one source's results folder."""
    path = Path(given)
    if not path.exists():
        raise MergeError(f"{given}: no such folder or archive; pass a shard's reports folder,"
                         " its allure-results folder, or a .tar.gz/.zip of one")
    if path.is_file():
        if not given.endswith(ARCHIVES):
            raise MergeError(f"{given}: not a folder and not a {'/'.join(ARCHIVES)} archive")
        target = Path(tempfile.mkdtemp(prefix="src-", dir=scratch))
        try:
            _safe_extract(path, target)
        except (tarfile.TarError, zipfile.BadZipFile, OSError) as e:
            raise MergeError(f"{given}: cannot extract the archive ({e})") from None
        path = target
    results = find_results(path)
    if results is None:
        raise MergeError(f"{given}: no allure-results folder in it (expected *-result.json and"
                         " environment.properties written by `hil nightly`)")
    props = read_properties(results / "environment.properties")
    m = SHARD_RX.match(props.get("run.shard", ""))
    shard = (int(m.group(1)), int(m.group(2))) if m else None
    return Source(given=given, results=results, props=props, shard=shard,
                  plan=m.group(3).strip() if m else "")


def _shard_problems(sources: list[Source]) -> list[str]:
    problems = []
    sharded = [s for s in sources if s.shard]
    if sharded and len(sharded) < len(sources):
        plain = ", ".join(s.given for s in sources if not s.shard)
        problems.append(f"{plain}: not a shard (no run.shard in environment.properties) merged"
                        " with shards; its tests may repeat the shards' tests")
    totals = Counter(s.shard[1] for s in sharded)
    if len(totals) > 1:
        problems.append("shards of different splits merged: "
                        + ", ".join(f"{s.name}" for s in sharded) + "; rerun with one N")
    for n in totals:
        seen = Counter(s.shard[0] for s in sharded if s.shard[1] == n)
        missing = [i for i in range(1, n + 1) if i not in seen]
        if missing:
            problems.append(f"missing shard(s) of {n}: {', '.join(f'{i}/{n}' for i in missing)};"
                            " their tests are not in this report")
        for i, k in sorted(seen.items()):
            if k > 1:
                problems.append(f"shard {i}/{n} merged {k} times (from "
                                + ", ".join(s.given for s in sharded if s.shard == (i, n)) + ")")
    plans = {s.plan for s in sharded}
    if len(plans) > 1:
        problems.append("shards planned the split differently (different durations files), so"
                        " tests may be missing or run twice: "
                        + "; ".join(f"{s.name}: {s.plan or 'hash'}" for s in sharded))
    return problems


def _version_problems(sources: list[Source]) -> list[str]:
    """Name every shard whose stack or harness differs from the most common one."""
    problems = []
    keys = [k for k in SAME_STACK if any(k in s.props for s in sources)]
    keys += sorted({k for s in sources for k in s.props if k.startswith("stack.")})
    for key in keys:
        values = Counter(s.props.get(key, "absent") for s in sources)
        if len(values) < 2:
            continue
        (common, top), (_, second) = values.most_common(2)
        # On a tie the first source is the reference.
        if top == second:
            common = sources[0].props.get(key, "absent")
        who = "most ran" if top > second else f"{sources[0].name} ran"
        odd = [f"{s.name}: {s.props.get(key, 'absent')}" for s in sources
               if s.props.get(key, "absent") != common]
        problems.append(f"{key} differs between shards: {who} {common}; " + "; ".join(odd))
    return problems


def _merged_properties(sources: list[Source]) -> dict[str, str]:
    keys = list(dict.fromkeys(k for s in sources for k in s.props))
    out: dict[str, str] = {}
    for key in keys:
        values = [(s, s.props.get(key)) for s in sources if key in s.props]
        distinct = list(dict.fromkeys(v for _, v in values))
        if len(distinct) == 1 and len(values) == len(sources):
            out[key] = distinct[0] or ""
        else:
            out[key] = "; ".join(f"{v} [{', '.join(s.name for s, w in values if w == v)}]"
                                 for v in distinct)
    out["merge.sources"] = "; ".join(f"{s.name}: {s.tests} tests" for s in sources)
    return out


def copies_problem(opened: list[tuple[Source, ResultsFolder]]) -> str | None:
    """Two sources that hold the same test results (the same result uuids, or the same tests
    with the same start times): one is a copy of the other, whatever shard it is labelled."""
    def keys(folder: ResultsFolder) -> tuple[set[str], set[tuple[str, object]]]:
        tests = folder.tests
        return ({str(t["uuid"]) for t in tests},
                {(str(t.get("historyId") or t["name"]), t.get("start")) for t in tests})

    seen = [(src, *keys(folder)) for src, folder in opened]
    for i, (a, uuids_a, runs_a) in enumerate(seen):
        for b, uuids_b, runs_b in seen[i + 1:]:
            same = uuids_a & uuids_b
            how = "the same result uuids"
            if not same and runs_a and runs_a == runs_b:
                same, how = runs_a, "the same tests with the same start times"
            if same:
                labels = f" (labelled {a.name} and {b.name})" if a.shard != b.shard else ""
                return (f"{a.given} and {b.given} hold {len(same)} identical test result(s)"
                        f" ({how}){labels}: one is a copy of the other; merge each shard's own"
                        " results once. Nothing was changed")
    return None


def merge_results(sources: list[str], out: Path) -> Merged:
    """Merge ``sources`` into the folder ``out``, replaced only once the merge is done.
    Every source is opened and checked first: one that cannot be opened, or two that are
    copies of one another, raise MergeError with ``out`` untouched. Unreadable files of a
    source are skipped and named."""
    out = Path(out)
    scratch = out.parent / f".{out.name}-sources"
    fresh = out.parent / f".{out.name}-new"
    old = out.parent / f".{out.name}-old"
    for leftover in (scratch, fresh, old):
        shutil.rmtree(leftover, ignore_errors=True)
    scratch.mkdir(parents=True)
    merged = Merged(folder=out)
    try:
        try:
            opened = [open_source(s, scratch) for s in sources]
        except OSError as e:
            raise MergeError(f"{e.filename}: cannot read the source ({os.strerror(e.errno or 0)});"
                             " nothing was changed") from None
        folders = [load_results(src.results) for src in opened]
        problem = copies_problem(list(zip(opened, folders, strict=True)))
        if problem:
            raise MergeError(problem)
        fresh.mkdir()
        for src, folder in zip(opened, folders, strict=True):
            src.tests = len(folder.results)
            merged.problems += [f"{src.name}: {p}" for p in folder.problems]
            for path in [*folder.results, *folder.containers, *folder.attachments]:
                dest = fresh / path.name
                if dest.exists():
                    merged.problems.append(f"{src.name}: {path.name} already merged from another"
                                           " source; skipped")
                    continue
                shutil.copy2(path, dest)
            executor = src.results / "executor.json"
            if executor.is_file() and not (fresh / "executor.json").exists():
                shutil.copy2(executor, fresh / "executor.json")
        merged.sources = opened
        shard_problems = _shard_problems(opened)
        merged.complete = not shard_problems
        merged.problems = shard_problems + _version_problems(opened) + merged.problems
        (fresh / "environment.properties").write_text(format_properties(_merged_properties(opened)))
        write_categories(fresh)
        swap_in(fresh, out, old)
    finally:
        for leftover in (scratch, fresh, old):
            shutil.rmtree(leftover, ignore_errors=True)
    return merged


def where_ran(tests: list[dict[str, Any]], shard_of_uuid: dict[str, str] | None = None
              ) -> list[tuple[str, str, str, str]]:
    """(test, host, device, status) of every test, sorted by test."""
    rows = []
    for t in tests:
        labels, params = labels_of(t), params_of(t)
        name = (labels.get("nodeid") or [str(t.get("name"))])[0]
        rows.append((name, (labels.get("host") or ["?"])[0], params.get("device", "?"),
                     str(t.get("status") or "unknown")))
    return sorted(rows)


def where_markdown(tests: list[dict[str, Any]]) -> str:
    """The summary's section on which host and card ran what: counts per host and card,
    then every test (folded, it is long)."""
    rows = where_ran(tests)
    if not rows:
        return ""
    per = Counter((host, device) for _, host, device, _ in rows)
    lines = ["## Where the tests ran", "", "| host | card | tests |", "|---|---|---|"]
    lines += [f"| {h} | {d} | {n} |" for (h, d), n in sorted(per.items())]
    lines += ["", "<details><summary>every test: host, card, status</summary>", "",
              "| test | host | card | status |", "|---|---|---|---|"]
    lines += [f"| `{n.replace('|', '/')}` | {h} | {d} | {s} |" for n, h, d, s in rows]
    lines += ["", "</details>", ""]
    return "\n".join(lines)


def durations_of(tests: list[dict[str, Any]]) -> dict[str, float]:
    """Seconds per test node id (Allure's start/stop, milliseconds)."""
    out: dict[str, float] = {}
    for t in tests:
        nodeid = (labels_of(t).get("nodeid") or [""])[0]
        start, stop = t.get("start"), t.get("stop")
        if nodeid and isinstance(start, (int, float)) and isinstance(stop, (int, float)):
            out[nodeid] = out.get(nodeid, 0.0) + max(0.0, (stop - start) / 1000.0)
    return out
