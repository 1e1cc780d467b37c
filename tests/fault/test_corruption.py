"""Exhaustive damage of a small step, per backend: every metadata byte flipped, every
7th data byte flipped, every file cut at 60-odd lengths (tests/jobs/corrupt_steps.py).

Each damage ends with the step restored exactly (the byte was unused) or with a
fallback to the older step naming the damaged step, and verify agreeing; never a crash,
an exception, a hang or data that differs. The checks of one backend are shared by two
processes (this machine has two cores).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.helpers import BACKENDS
from tests.processes import run_group, started_group

PARTS = 2
DATA_STRIDE = 7
TIMEOUT = 150  # seconds for all the checks of one backend (about 25 s here for hdf5)
MAX_CHECK_SECONDS = 2.0  # the slowest check here took 0.03 s
MAX_PEAK_GROWTH_KIB = 64 << 10  # the largest growth of peak memory here was 4.3 MiB


def run_parts(backend: str, tmp_path: Path) -> list[dict]:
    """Run the checks of ``backend`` in PARTS processes; their reports."""
    driver = [sys.executable, "-m", "tests.jobs.corrupt_steps"]
    saved = run_group([*driver, "save", backend, str(tmp_path / "saved")], timeout=60)
    assert saved.returncode == 0, saved.stderr[-3000:]
    reports = [tmp_path / f"report-{part}.json" for part in range(PARTS)]
    commands = [
        [*driver, "check", backend, str(tmp_path / "saved"), str(report), str(DATA_STRIDE), f"{part}/{PARTS}"]
        for part, report in enumerate(reports)
    ]
    with started_group(commands[0]) as first, started_group(commands[1]) as second:
        for process, report in zip((first, second), reports):
            _, stderr = process.communicate(timeout=TIMEOUT)
            current = Path(str(report) + ".current")
            during = current.read_text() if current.exists() else "none"
            assert process.returncode == 0, (
                f"exit {process.returncode} while checking damage {during}:\n{stderr[-3000:]}"
            )
    return [json.loads(report.read_text()) for report in reports]


@pytest.mark.parametrize("backend", [*BACKENDS, "posix-blosc2"])
def test_every_damaged_byte_or_cut_falls_back_or_restores_exactly(backend, tmp_path):
    reports = run_parts(backend, tmp_path)
    failures = [failure for report in reports for failure in report["failures"]]
    assert not failures, f"{len(failures)} damages went wrong, e.g. {failures[:5]}"
    counts: dict[str, int] = {}
    for report in reports:
        for key, count in report["counts"].items():
            counts[key] = counts.get(key, 0) + count
    assert not any(key.startswith("cut") and key.endswith("harmless") for key in counts), counts
    for name, sizes in reports[0]["files"].items():  # every metadata byte flipped, 60 cuts
        flips, cuts = (sum(report["files"][name][kind] for report in reports) for kind in ("flips", "cuts"))
        assert flips >= sizes["bytes"] - sizes["data_bytes"] and cuts >= 60, (name, sizes, flips, cuts)
    data = sum(sizes["data_bytes"] for sizes in reports[0]["files"].values())
    assert (data == 0) == (backend == "posix-blosc2"), reports[0]["files"]  # compressed blocks: all flipped
    slowest = max(report["slowest_check"][0] for report in reports)
    growth = max(report["largest_peak_growth_kib"][0] for report in reports)
    print(
        f"{backend}: {sum(r['checks'] for r in reports)} damages: {counts}; "
        f"slowest check {slowest:.3f} s, largest peak-memory growth {growth} KiB"
    )
    assert slowest < MAX_CHECK_SECONDS and growth < MAX_PEAK_GROWTH_KIB, reports
