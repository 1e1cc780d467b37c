"""tests/MAP.md, the map from each module of hpckpt to its tests, stays true: every module
has a row, and every row names a module and test files that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MAP = REPO / "tests" / "MAP.md"
ROW = re.compile(r"^\|\s*`(?P<module>[^`]+)`\s*\|(?P<tests>.*)\|\s*$")


def map_rows() -> dict[str, list[str]]:
    """The map's rows: module path -> the test files its row names (paths from the repository root)."""
    rows: dict[str, list[str]] = {}
    for number, line in enumerate(MAP.read_text().splitlines(), 1):
        match = ROW.match(line)
        if match is None:
            continue
        module = match.group("module")
        assert module not in rows, f"tests/MAP.md line {number}: a second row for {module}"
        rows[module] = re.findall(r"`([^`]+)`", match.group("tests"))
    return rows


def modules() -> list[str]:
    """Every module of the hpckpt package, as a path from the repository root."""
    return sorted(path.relative_to(REPO).as_posix() for path in (REPO / "hpckpt").rglob("*.py"))


@pytest.fixture(scope="module")
def rows() -> dict[str, list[str]]:
    return map_rows()


def test_every_module_of_hpckpt_has_a_row(rows):
    """A module added to hpckpt/ needs a row naming the tests that exercise it."""
    missing = [module for module in modules() if module not in rows]
    assert not missing, f"modules without a row in tests/MAP.md: {', '.join(missing)}"


def test_every_row_names_an_existing_module(rows):
    """A module renamed or removed takes its row with it."""
    stale = [module for module in rows if not (REPO / module).is_file()]
    assert not stale, f"tests/MAP.md has rows for modules that do not exist: {', '.join(stale)}"


def test_every_row_names_existing_test_files(rows):
    """Each row names at least one test file, and each test file it names exists."""
    wrong = []
    for module, tests in rows.items():
        if not tests:
            wrong.append(f"{module}: no test file")
        for test in tests:
            path = REPO / test
            if not (test.startswith("tests/") and path.name.startswith("test_") and path.is_file()):
                wrong.append(f"{module}: {test} is not a test file")
    assert not wrong, "tests/MAP.md rows that name no test or a missing one:\n" + "\n".join(wrong)
