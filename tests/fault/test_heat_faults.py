"""SIGKILL a rank of a real ``mpiexec`` job at random moments; the relaunched job must
end with exactly the fault-free result, and never restore a torn step."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.fault.conftest import JOB_TIMEOUT, Finished, heat_command, relaunched, run

RANKS = 4
SAVE_POINTS = ("save.plan", "save.write", "save.commit", "save.retain")
BACKENDS = ("hdf5", "adios2", "posix")


def rank_pids(token: str) -> dict[int, int]:
    """PIDs of the first attempt's ranks of the job tagged with ``token``, by rank."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        variables = dict(item.split(b"=", 1) for item in environ if b"=" in item)
        if (
            variables.get(b"HEAT_TRIAL") == token.encode()
            and variables.get(b"HPCKPT_ATTEMPT") == b"0"
            and b"hpckpt.examples.heat" in cmdline
            and b"PMI_RANK" in variables
        ):
            found[int(variables[b"PMI_RANK"])] = int(entry)
    return found


def run_with_external_kill(command: list[str], rng: random.Random) -> tuple[Finished, bool]:
    """Run ``command``; SIGKILL a random rank of its first attempt after a random delay."""
    token = uuid.uuid4().hex
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "HEAT_TRIAL": token}
    )
    deadline = time.monotonic() + 20
    pids: dict[int, int] = {}
    while len(pids) < RANKS and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
        pids = rank_pids(token)
    victim = rng.randrange(RANKS)
    # Ranks start about 2.5 s of imports, restore, solver steps and saves; a kill after the
    # victim finished would miss, so the window ends well before (a loaded machine only widens it).
    time.sleep(rng.uniform(0.3, 1.5))
    delivered = False
    if victim in pids:
        try:
            os.kill(pids[victim], signal.SIGKILL)
            delivered = True
        except ProcessLookupError:
            pass
    stdout, stderr = process.communicate(timeout=JOB_TIMEOUT)
    return Finished(process.returncode, stdout, stderr), delivered


@pytest.mark.parametrize("seed", range(20))
def test_sigkill_at_random_moments_resumes_bit_for_bit(seed, tmp_path, reference_checksum):
    rng = random.Random(seed)
    run_dir = tmp_path / "ckpt"
    mode = ("save-point", "iteration", "external")[seed % 3]
    backend = ["--backend", BACKENDS[seed // 3 % 3]]  # seeds 0-8 take every mode with every backend
    if mode == "save-point":
        fault = f"{rng.choice(SAVE_POINTS)}:{rng.randrange(RANKS)}:kill:{rng.randint(1, 11)}"
        result, delivered = run(relaunched(heat_command(RANKS, run_dir, *backend)), env={"HPCKPT_FAULT": fault}), True
    elif mode == "iteration":
        crash = ["--crash-at-iter", str(rng.randint(0, 119)), "--crash-rank", str(rng.randrange(RANKS))]
        result, delivered = run(relaunched(heat_command(RANKS, run_dir, *backend, *crash))), True
    else:
        result, delivered = run_with_external_kill(relaunched(heat_command(RANKS, run_dir, *backend)), rng)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.checksum == reference_checksum
    if delivered:
        assert result.failed_attempts == 1, result.stderr[-3000:]
    assert "is corrupt" not in result.stderr  # a torn step is never committed


def test_uneven_rank_counts_match_the_reference(tmp_path, reference_checksum):
    for ranks in (3, 5):
        result = run(heat_command(ranks, tmp_path / f"ckpt{ranks}", n=97))
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.checksum == run(heat_command(1, tmp_path / f"ref{ranks}", n=97, every=0)).checksum


def test_error_inside_collective_io_aborts_with_a_message_and_resumes(tmp_path, reference_checksum):
    command = relaunched(heat_command(RANKS, tmp_path / "ckpt"))
    result = run(command, env={"HPCKPT_FAULT": "save.write:1:raise:3"})
    assert result.returncode == 0 and result.checksum == reference_checksum
    assert "in phase 'save step 30: write' during collective I/O; aborting the job" in result.stderr
    assert "InjectedFault: injected fault at save.write on rank 1" in result.stderr
    assert result.resumed_from == "20" and result.failed_attempts == 1


def test_error_in_commit_on_one_rank_reaches_every_rank(tmp_path, reference_checksum):
    result = run(relaunched(heat_command(RANKS, tmp_path / "ckpt")), env={"HPCKPT_FAULT": "save.commit:0:raise:5"})
    assert result.returncode == 0 and result.checksum == reference_checksum
    assert "phase 'save step 50: commit' failed on rank(s) 0 of 4" in result.stderr
    assert result.resumed_from == "40" and result.failed_attempts == 1


@pytest.mark.parametrize("backend", ["hdf5", "adios2", "posix"])
def test_resuming_on_fewer_ranks_matches_the_reference(tmp_path, reference_98, backend):
    """4 ranks for the first half, 3 ranks to 3/4, then 2 ranks to the end (all uneven rows but 2)."""
    run_dir = tmp_path / backend
    for ranks, stop in ((4, 60), (3, 90)):
        result = run(heat_command(ranks, run_dir, "--backend", backend, "--stop-at-iter", str(stop), n=98))
        assert result.returncode == 0, result.stderr
        assert f"heat: stopped at iteration {stop} on {ranks} ranks" in result.stdout
    result = run(heat_command(2, run_dir, "--backend", backend, n=98))
    assert result.returncode == 0, result.stderr
    assert result.resumed_from == "90"
    assert result.checksum == reference_98


@pytest.mark.parametrize("seed", range(4))
def test_sigkill_with_non_blocking_saves_resumes_bit_for_bit(seed, tmp_path, reference_checksum):
    """Kills while the background thread writes or commits a step."""
    rng = random.Random(500 + seed)
    run_dir = tmp_path / "ckpt"
    command = heat_command(RANKS, run_dir, "--async", "--backend", BACKENDS[seed % 3])
    if seed % 2 == 0:
        fault = f"{rng.choice(SAVE_POINTS[1:])}:{rng.randrange(RANKS)}:kill:{rng.randint(1, 11)}"
        result = run(relaunched(command), env={"HPCKPT_FAULT": fault})
    else:
        result, _ = run_with_external_kill(relaunched(command), rng)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.checksum == reference_checksum
    assert "is corrupt" not in result.stderr
