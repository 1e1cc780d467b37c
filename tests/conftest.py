"""Suite-wide rules. With ``HPCKPT_REQUIRE_ALL=1`` (set by ``.ci/run``) a skipped test or
module is a failure that names what was missing: CI cannot pass by skipping Slurm, the
ULFM environment, torch, tmpfs mounts or the 4-rank tests. Only the hardware that is
absent here may skip: a GPU (tests/gpu)."""

from __future__ import annotations

import os

import pytest

REQUIRE_ALL = os.environ.get("HPCKPT_REQUIRE_ALL") == "1"
MAY_SKIP = ("tests/gpu/",)  # no GPU on the CI machine
MAY_SKIP_REASONS = ("CuPy is installed",)  # a real GPU machine: tests/gpu covers it


def _required(nodeid: str, reason: str) -> bool:
    return (
        REQUIRE_ALL
        and not nodeid.startswith(MAY_SKIP)
        and not any(text in reason for text in MAY_SKIP_REASONS)
    )


def _reason(report: pytest.BaseReport) -> str:
    longrepr = report.longrepr
    return longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)


def _fail_if_required(report: pytest.BaseReport, nodeid: str) -> None:
    """Turn ``report``, a skip of something CI must run, into a failure saying why."""
    if report.skipped and not hasattr(report, "wasxfail") and _required(nodeid, _reason(report)):
        report.outcome = "failed"
        report.longrepr = (
            f"a part this suite must exercise is unavailable (HPCKPT_REQUIRE_ALL=1): {_reason(report)}"
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> None:
    outcome = yield
    _fail_if_required(outcome.get_result(), item.nodeid)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> None:
    outcome = yield
    report = outcome.get_result()
    _fail_if_required(report, report.nodeid)
