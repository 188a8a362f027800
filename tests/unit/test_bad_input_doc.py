"""docs/bad-input.md: every section's rows are asserted by tests that exist. Each "Tests per
row" table names test functions (``test_...``) and child-pytest rows (``[row-id]``); a name that
no test file defines is a row nobody asserts."""

from __future__ import annotations

import re

from harness.core.paths import REPO_ROOT

DOC = REPO_ROOT / "docs" / "bad-input.md"
TESTS = REPO_ROOT / "tests"


def _test_tables(text: str) -> list[list[str]]:
    """The ``| row | test |`` tables of the page, as their cells in the test column."""
    tables, current = [], None
    for line in text.splitlines():
        if line.startswith("| row | test |"):
            current = []
            tables.append(current)
        elif current is not None and line.startswith("|"):
            if not line.startswith("|---"):
                current.append(line.rsplit("|", 2)[-2])
        else:
            current = None
    return tables


def _defined() -> tuple[set[str], str]:
    sources = "\n".join(p.read_text() for p in TESTS.rglob("test_*.py"))
    return set(re.findall(r"^\s*def (test_\w+)", sources, re.M)), sources


def _child_row_ids() -> set[str]:
    from tests.unit.plugin.test_bad_arguments import ROWS
    from tests.unit.plugin.test_bad_files import ROWS as FILE_ROWS

    return {r.id for r in (*ROWS, *FILE_ROWS)}


def test_every_section_of_rows_has_its_tests_and_they_exist():
    text = DOC.read_text()
    tables = _test_tables(text)
    sections = [h for h in re.findall(r"^## (.+)$", text, re.M)
                if not h.startswith(("Exit codes", "Fuzzing", "Arguments and input files"))]
    assert len(tables) == len(sections), (sections, len(tables))
    functions, _ = _defined()
    row_ids = _child_row_ids()
    missing = []
    for cells in tables:
        assert cells, "a test table without rows"
        for cell in cells:
            names = re.findall(r"\b(test_\w+)\b(?!\.py)", cell)
            assert names or "[" in cell, f"a row without a test: {cell}"
            missing += [n for n in names if n not in functions]
            # Child-pytest rows are named by their id: T `[id]`, child `id`.
            for part in re.split(r";", cell):
                part = part.strip()
                if part.startswith("T "):
                    missing += [i for i in re.findall(r"\[([\w.-]+)\]", part) if i not in row_ids]
                elif part.startswith("child "):
                    missing += [i for i in re.findall(r"`([\w.-]+)`", part) if i not in row_ids]
    assert not missing, f"docs/bad-input.md names tests that do not exist: {missing}"


def test_the_first_table_is_the_child_pytest_rows():
    """The table of arguments and input files is test_bad_arguments.py's ROWS, each by id."""
    from tests.unit.plugin.test_bad_arguments import ROWS

    assert len({r.id for r in ROWS}) == len(ROWS)
    assert len(ROWS) >= 30
