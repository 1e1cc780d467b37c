"""A storage problem on one node never takes the computation down under ``on_failure="warn"``,
and ends a ``"raise"`` job within the deadline, naming the rank.

The heat solver runs on 2 lab nodes with 2 ranks each (ranks 2 and 3 on node2), paced so
that it runs long enough for the fault, and rank 0 (on node1) logs each iteration with
its monotonic time (``--progress``). The faults are real, in node2's client cache of the
shared file system (tests/lab/nodecache.c) or in the disk under it:

- **frozen storage**: node2's cache process is stopped, so every write through it waits
  in the kernel as on a stuck OST, then continued after :data:`FREEZE_SECONDS`;
- **EIO**: every write and fsync through node2's cache fails for a while;
- **ENOSPC**: the disk is a small tmpfs, filled from outside, then emptied.

Asserted: with ``"raise"`` a frozen write ends the job within the phase deadline and
names a rank of node2; with ``"warn"`` the job steps on through every fault (progress
lines inside the frozen interval), ends with the fault-free checksum, records the
failed, abandoned and skipped saves with node2's ranks, commits again once the storage
is back, never commits a failed step, and a restart resumes from the newest committed
step bit for bit.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hpckpt.storage.commit import RunDirectory
from tests.heat_output import DONE, Finished
from tests.lab.cluster import Job, Lab
from tests.lab.helpers import heat, labs_under
from tests.processes import run_group

PHASE_TIMEOUT = 3  # s: HPCKPT_PHASE_TIMEOUT of the jobs, so a stuck write passes its deadline soon
# How long node2's storage stays frozen: 10 s, three deadlines, keeps each test short. A 60 s
# freeze runs with HPCKPT_LAB_FREEZE=60 and pytest --timeout 300 (about 100 s a test).
FREEZE_SECONDS = float(os.environ.get("HPCKPT_LAB_FREEZE", "10"))
PACE = 0.05  # s per iteration
EVERY = 20  # iterations between saves; the EIO and ENOSPC trials save every FAULT_EVERY
FAULT_EVERY, FAULT_ITERS = 40, 200  # a fault toggled mid-way between saves: 1 s from either
FROZEN_NODE = "node2"
FROZEN_RANKS = {2, 3}  # ranks_per_node=2: ranks 2 and 3 run on node2
ENV = {"HPCKPT_PHASE_TIMEOUT": str(PHASE_TIMEOUT)}
Progress = list[tuple[int, float]]  # rank 0's (iteration, monotonic time) lines
FAILURES = re.compile(r"^heat: failures (\[.*\])$", re.MULTILINE)


# --- helpers ----------------------------------------------------------------------------------


_CHECKSUMS: dict[int, str] = {}


def reference(iters: int) -> str:
    """The fault-free checksum of the heat solver (``n=96``) after ``iters`` iterations, on
    one rank without checkpoints (computed once per ``iters``)."""
    if iters not in _CHECKSUMS:
        with tempfile.TemporaryDirectory(prefix="storage-faults-reference-") as directory:
            result = run_group(heat(f"{directory}/c", iters=iters, every=0), timeout=60)
        assert result.returncode == 0, result.stderr
        _CHECKSUMS[iters] = DONE.search(result.stdout).group(3)
    return _CHECKSUMS[iters]


def progress(path: Path) -> Progress:
    """The (iteration, monotonic time) lines rank 0 wrote so far."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    return [(int(line.split()[0]), float(line.split()[1])) for line in lines if len(line.split()) == 2]


def wait_for_iteration(job: Job, path: Path, iteration: int, timeout: float = 30) -> float:
    """Wait until rank 0 has logged ``iteration``; its time. Fails if the job ends first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = progress(path)
        if lines and lines[-1][0] >= iteration:
            return lines[-1][1]
        if job.process.poll() is not None:
            job.finish(1)
            pytest.fail(f"the job ended before iteration {iteration}:\n{job.stdout}\n{job.stderr[-3000:]}")
        time.sleep(0.01)
    job.kill()
    pytest.fail(f"no iteration {iteration} within {timeout} s:\n{job.stderr[-3000:]}")


def failures(result: Finished) -> list[dict]:
    """The failure records the job printed (``heat: failures [...]``)."""
    match = FAILURES.search(result.stdout)
    assert match, f"no 'heat: failures' line:\n{result.stdout}\n{result.stderr[-3000:]}"
    return json.loads(match.group(1))


def finished(job: Job, timeout: float) -> Finished:
    job.finish(timeout)
    assert job.returncode is not None
    return Finished(job.returncode, job.stdout, job.stderr)


def committed(lab: Lab) -> list[int]:
    return RunDirectory(lab.disk / "ckpt").committed_steps()


def saves(iters: int, every: int = EVERY) -> list[int]:
    """The steps the heat solver saves (every ``every`` iterations, not at the end)."""
    return list(range(every, iters, every))


def verify_all(lab: Lab) -> None:
    """Every committed step on the disk verifies block by block."""
    check = run_group([sys.executable, "-m", "hpckpt", "verify", str(lab.disk / "ckpt"), "--all"], timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr


def saved_at(lines: Progress, step: int) -> float:
    """When rank 0 logged iteration ``step`` (just after it asked for that save)."""
    return next(t for iteration, t in lines if iteration == step)


def heat_job(lab: Lab, progress_file: Path, iters: int, *options: str, every: int = EVERY) -> Job:
    command = heat(
        "ckpt", "--pace", str(PACE), "--progress", str(progress_file), "--keep", "100", *options,
        iters=iters, every=every,
    )
    return lab.start(lab.mpiexec(command), env=ENV)


# --- stuck storage ----------------------------------------------------------------------------


def test_frozen_storage_ends_a_raise_job_within_the_deadline(lab, tmp_path):
    """Blocking saves, ``"raise"``: the save whose writes hang on node2 ends the job with
    an error naming a rank of node2, within the deadline (plus the I/O allowance and the
    watchdog's grace periods), not never."""
    progress_file = tmp_path / "progress"
    job = heat_job(lab, progress_file, 400)
    try:
        wait_for_iteration(job, progress_file, EVERY + 5)  # the first save has committed
        lab.freeze_storage(FROZEN_NODE)
        frozen_at = time.monotonic()
        try:
            job.process.wait(PHASE_TIMEOUT + 25)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the job still runs {PHASE_TIMEOUT + 25} s after node2's storage froze")
        ended = time.monotonic() - frozen_at
    finally:
        if lab.nodes[FROZEN_NODE].frozen:
            lab.thaw_storage(FROZEN_NODE)
    result = finished(job, 10)
    assert result.returncode != 0, result.stdout
    assert ended < PHASE_TIMEOUT + 10, f"ended {ended:.1f} s after the freeze:\n{result.stderr[-3000:]}"
    named = re.findall(r"rank (\d+)", result.stderr)
    assert FROZEN_RANKS & set(map(int, named)), result.stderr[-3000:]
    assert FROZEN_NODE in result.stderr, result.stderr[-3000:]
    assert re.search(r"ckpt/step-\d{8}\.tmp/", result.stderr), "the stuck file is named"
    assert committed(lab) == [EVERY], "the committed step stays, nothing newer commits"
    verify_all(lab)


def freeze_trial(lab: Lab, tmp_path: Path, *options: str) -> tuple[Finished, Progress, float, float]:
    """Run the heat solver under ``"warn"``, freeze node2's storage for FREEZE_SECONDS
    after the second save, then thaw it; the result, rank 0's progress, the freeze and
    thaw times."""
    iters = int((FREEZE_SECONDS + 5) / PACE) // EVERY * EVERY
    progress_file = tmp_path / "progress"
    job = heat_job(lab, progress_file, iters, "--on-failure", "warn", "--max-failed-saves", "1000", *options)
    try:
        wait_for_iteration(job, progress_file, 2 * EVERY + 5)
        lab.freeze_storage(FROZEN_NODE)
        frozen_at = time.monotonic()
        time.sleep(FREEZE_SECONDS)
        if job.process.poll() is not None:
            pytest.fail(f"the job ended during the freeze:\n{job.stdout}\n{job.stderr[-3000:]}")
        lab.thaw_storage(FROZEN_NODE)
        thawed_at = time.monotonic()
    finally:
        if lab.nodes[FROZEN_NODE].frozen:
            lab.thaw_storage(FROZEN_NODE)
    result = finished(job, 20 + 2 * time_left(progress(progress_file), iters))
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert result.checksum == reference(iters)
    return result, progress(progress_file), frozen_at, thawed_at


def time_left(lines: Progress, iters: int) -> float:
    """How long the job's remaining iterations take at the pace it has kept so far (a
    loaded machine runs slower than PACE)."""
    (first, started), (last, now) = lines[0], lines[-1]
    return (iters - last) * max(PACE, (now - started) / max(1, last - first))


def assert_stepped_through(lines: Progress, frozen_at: float, thawed_at: float) -> None:
    """Rank 0 logged iterations all through the freeze, never waiting much longer than a deadline."""
    during = [t for _, t in lines if frozen_at <= t <= thawed_at]
    expected = (thawed_at - frozen_at - PHASE_TIMEOUT) / PACE
    assert len(during) >= expected / 3, f"{len(during)} iterations in the freeze, {expected:.0f} at full pace"
    times = [frozen_at, *during, thawed_at]
    gap = max(later - earlier for earlier, later in itertools.pairwise(times))
    assert gap < PHASE_TIMEOUT + 4, f"the application waited {gap:.1f} s during the freeze"


def assert_frozen_saves_recorded(
    records: list[dict], lines: Progress, frozen_at: float, thawed_at: float, candidates: list[int]
) -> None:
    """The saves asked for during the freeze are recorded, and nothing else: the first
    abandoned, later ones skipped, each naming node2's ranks only (the ranks that only
    wait for them are not named)."""
    assert {record["kind"] for record in records} == {"abandoned", "skipped"}, records
    for record in records:
        assert record["step"] in candidates, record
        asked = saved_at(lines, record["step"])
        # asked during the freeze, or one save before it (still in flight) or after the thaw
        assert frozen_at - PACE * EVERY <= asked <= thawed_at + PACE * EVERY, (record, frozen_at, thawed_at)
        assert record["ranks"] and set(record["ranks"]) <= FROZEN_RANKS, json.dumps(record)
    first = min(records, key=lambda record: record["step"])
    assert first["kind"] == "abandoned", records
    assert set(first["ranks"]) <= FROZEN_RANKS, first
    assert FROZEN_NODE in first["reason"] and f"step-{first['step']:08d}" in first["reason"], first


def test_frozen_storage_under_warn_with_non_blocking_saves(lab, tmp_path):
    """``"warn"``, non-blocking saves: the stuck save is abandoned after the deadline, the
    next ones are skipped while node2's storage is frozen, and saves commit again after
    the thaw; the application never stops stepping."""
    result, lines, frozen_at, thawed_at = freeze_trial(lab, tmp_path, "--async")
    assert_stepped_through(lines, frozen_at, thawed_at)
    records = failures(result)
    steps = saves(lines[-1][0])
    assert_frozen_saves_recorded(records, lines, frozen_at, thawed_at, steps)
    on_disk = committed(lab)
    assert on_disk[-1] == steps[-1], f"the final save did not commit: {on_disk}"
    assert not {record["step"] for record in records} & set(on_disk), (records, on_disk)
    assert [step for step in on_disk if saved_at(lines, step) > thawed_at], "nothing committed after the thaw"
    assert "SaveFailedWarning" in result.stderr
    verify_all(lab)


def test_frozen_storage_under_warn_with_a_node_local_level(lab, tmp_path):
    """``"warn"``, node-local level flushed every second save: the local saves go on
    during the freeze, the stuck flush is abandoned and the next ones skipped; flushes
    commit again after the thaw, without a restart."""
    result, lines, frozen_at, thawed_at = freeze_trial(
        lab, tmp_path, "--local", "default", "--flush-every", "2"
    )
    assert_stepped_through(lines, frozen_at, thawed_at)
    records = failures(result)
    flushed = saves(lines[-1][0])[1::2]  # the second, fourth, ... save is flushed
    assert_frozen_saves_recorded(records, lines, frozen_at, thawed_at, flushed)
    on_disk = committed(lab)
    assert on_disk[-1] == flushed[-1], f"the final flush did not commit: {on_disk}"
    assert not {record["step"] for record in records} & set(on_disk), (records, on_disk)
    assert [step for step in on_disk if saved_at(lines, step) > thawed_at], "nothing flushed after the thaw"
    verify_all(lab)


# --- failing writes ---------------------------------------------------------------------------


def fault_trial(
    lab: Lab, tmp_path: Path, start: Callable[[], object], stop: Callable[[], object], *options: str
) -> tuple[Finished, list[int]]:
    """Run the heat solver under ``"warn"``, saving every FAULT_EVERY iterations; call
    ``start()`` half-way between the first and the second save, ``stop()`` half-way
    between the third and the fourth, so that exactly the second and third saves meet
    the fault. The result and those two steps."""
    progress_file = tmp_path / "progress"
    job = heat_job(lab, progress_file, FAULT_ITERS, "--on-failure", "warn", *options, every=FAULT_EVERY)
    try:
        wait_for_iteration(job, progress_file, FAULT_EVERY + FAULT_EVERY // 2)
        start()
        wait_for_iteration(job, progress_file, 3 * FAULT_EVERY + FAULT_EVERY // 2)
    finally:
        stop()
    result = finished(job, 40)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert result.checksum == reference(FAULT_ITERS)
    return result, [2 * FAULT_EVERY, 3 * FAULT_EVERY]


def assert_failed_then_committed(
    lab: Lab, result: Finished, failed: list[int], ranks: set[int] | None
) -> None:
    """Exactly the ``failed`` steps are recorded as failed (naming only ``ranks``, when
    given) and absent from the disk; every other save committed and verifies; a restart
    resumes from the newest committed step and ends bit for bit the same."""
    records = failures(result)
    assert [record["step"] for record in records] == failed, records
    for record in records:
        assert record["kind"] == "failed", record
        if ranks is not None:
            assert record["ranks"] and set(record["ranks"]) <= ranks, record
    expected = [step for step in saves(FAULT_ITERS, FAULT_EVERY) if step not in failed]
    assert committed(lab) == expected
    verify_all(lab)
    again = lab.run(lab.mpiexec(heat("ckpt", "--keep", "100", iters=FAULT_ITERS, every=FAULT_EVERY)), env=ENV)
    assert again.returncode == 0, again.stderr[-3000:]
    resumed = Finished(0, again.stdout, again.stderr)
    assert resumed.resumed_from == str(expected[-1]) and resumed.checksum == reference(FAULT_ITERS)


@pytest.mark.parametrize("blocking", [True, False], ids=["blocking", "async"])
def test_write_errors_on_one_node_under_warn(lab, tmp_path, blocking):
    """Every write and fsync through node2's cache fails with EIO for two saves: they are
    recorded as failed by node2's ranks, training goes on, the next save commits."""
    result, failed = fault_trial(
        lab, tmp_path,
        lambda: lab.fail_writes(FROZEN_NODE, True),
        lambda: lab.fail_writes(FROZEN_NODE, False),
        *([] if blocking else ["--async"]),
    )
    assert all("Input/output error" in record["reason"] for record in failures(result)), failures(result)
    assert_failed_then_committed(lab, result, failed, FROZEN_RANKS)


def fill(directory: Path) -> Path:
    """Fill the file system of ``directory`` with one file, to ENOSPC; that file."""
    filler = directory / "filler"
    block = b"\0" * (1 << 16)
    with open(filler, "wb") as out:
        try:
            while True:
                out.write(block)
                out.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    return filler


def test_full_disk_under_warn(tmp_path):
    """The disk, a tmpfs of 8 MiB, fills up (ENOSPC) for two saves: they are recorded as
    failed, the committed steps stay intact, and once space is freed the next save commits."""
    with labs_under(tmp_path):  # skips, or fails where the lab is required, when it cannot run
        lab = Lab(tmp_path / "small", 2, disk_size="8m")
        try:
            filler = lab.disk / "filler"
            result, failed = fault_trial(
                lab, tmp_path, lambda: fill(lab.disk), lambda: filler.unlink(missing_ok=True)
            )
            records = failures(result)
            assert all("no space left" in record["reason"].lower() for record in records), records
            assert_failed_then_committed(lab, result, failed, None)
        finally:
            lab.close()
