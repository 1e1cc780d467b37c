"""Fault trials that prove their fault: the first attempt runs with it and must die of it
(the fault's own record says which rank, where and when); the newest committed step is
then read from the run directory; the second attempt, without the fault, must resume
from exactly that step. Exactly one attempt fails."""

from __future__ import annotations

import os
import random
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from hpckpt.storage.commit import RunDirectory
from hpckpt.testing.faults import ENV as FAULT_ENV
from hpckpt.testing.faults import LOG_ENV
from tests.fault.helpers import JOB_TIMEOUT, run
from tests.heat_output import Finished
from tests.processes import started_group

TRIAL_ENV = "HPCKPT_TRIAL"  # tags the processes of one trial, for the external kill to find
SAVE_POINTS = ("save.plan", "save.write", "save.commit", "save.retain")
MODES = ("save-point", "crash", "external")  # how a seeded trial's first attempt is killed


@dataclass(frozen=True)
class Landed:
    """Where a fault hit: the rank, what it was doing (a fault point, an application's
    crash point, or ``external``) and the process."""

    rank: int
    where: str
    pid: int


def logged_fault(log: Path) -> Landed:
    """The one fault recorded in ``HPCKPT_FAULT_LOG`` (``POINT RANK ACTION NTH PID``)."""
    lines = log.read_text().splitlines() if log.exists() else []
    assert len(lines) == 1, f"expected exactly one fault in {log}, found {lines}"
    where, rank, _action, _nth, pid = lines[0].split()
    return Landed(int(rank), where, int(pid))


def rank_pids(token: str, ranks: int) -> dict[int, int]:
    """PIDs of the MPI ranks tagged with ``token``, by rank (any program)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        variables = dict(item.split(b"=", 1) for item in environ if b"=" in item)
        if variables.get(TRIAL_ENV.encode()) == token.encode() and b"PMI_RANK" in variables:
            found[int(variables[b"PMI_RANK"])] = int(entry)
    return {rank: pid for rank, pid in found.items() if rank < ranks}


def run_with_external_kill(command: list[str], ranks: int, rng: random.Random) -> tuple[Finished, Landed]:
    """Run ``command``; SIGKILL a random rank from outside after a random delay.

    The kill must land: the victim is alive when signalled, else the trial fails.
    """
    token = uuid.uuid4().hex
    with started_group(command, env={**os.environ, TRIAL_ENV: token}) as process:
        deadline = time.monotonic() + 20
        pids: dict[int, int] = {}
        while len(pids) < ranks and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.05)
            pids = rank_pids(token, ranks)
        assert len(pids) == ranks, f"found ranks {sorted(pids)} of {ranks} in 20 s"
        victim = rng.randrange(ranks)
        # Ranks spend about 2.5 s in imports, restore, solver steps and saves: the window
        # ends well before the victim could be done (a loaded machine only widens it).
        time.sleep(rng.uniform(0.3, 1.5))
        os.kill(pids[victim], signal.SIGKILL)  # ProcessLookupError: the kill came too late
        stdout, stderr = process.communicate(timeout=JOB_TIMEOUT)
    return Finished(process.returncode, stdout, stderr), Landed(victim, "external", pids[victim])


def first_attempt(
    command: list[str],
    tmp_path: Path,
    ranks: int,
    rng: random.Random,
    *,
    fault: str | None = None,
    crash: bool = False,
) -> Landed:
    """Run the first attempt with its fault and check it died of it: ``fault`` is an
    ``HPCKPT_FAULT`` spec, ``crash`` says the command crashes itself, otherwise a random
    rank is killed from outside. Returns where the fault landed."""
    log = tmp_path / "faults.log"
    if fault is None and not crash:
        result, landed = run_with_external_kill(command, ranks, rng)
    else:
        result = run(command, env={LOG_ENV: str(log), **({FAULT_ENV: fault} if fault else {})})
        landed = logged_fault(log)
        if fault:
            point, rank = fault.split(":")[:2]
            assert (landed.where, landed.rank) == (point, int(rank)), landed
    assert result.returncode != 0, f"the first attempt survived its fault {landed}:\n{result.stderr[-3000:]}"
    return landed


def seeded_first_attempt(
    command: list[str],
    tmp_path: Path,
    ranks: int,
    rng: random.Random,
    mode: str,
    *,
    crash: tuple[str, str],
    first_kill: int = 1,
    first_crash: int = 0,
) -> None:
    """Run a seeded trial's first attempt, killed as ``mode`` (one of :data:`MODES`) says,
    with ``rng``'s choices: at a save point of a rank, the ``first_kill``-th to 11th time
    it is reached; by the application itself at an iteration from ``first_crash`` to 119
    (``crash``: its option, e.g. ``--crash-at-iter``, and the crash point's prefix, e.g.
    ``heat.iteration``); or from outside. Checks that the fault landed where it was aimed."""
    if mode == "save-point":
        fault = f"{rng.choice(SAVE_POINTS)}:{rng.randrange(ranks)}:kill:{rng.randint(first_kill, 11)}"
        first_attempt(command, tmp_path, ranks, rng, fault=fault)
    elif mode == "crash":
        (option, point), (at, rank) = crash, (rng.randint(first_crash, 119), rng.randrange(ranks))
        landed = first_attempt(
            command + [option, str(at), "--crash-rank", str(rank)], tmp_path, ranks, rng, crash=True
        )
        assert (landed.where, landed.rank) == (f"{point}.{at}", rank)
    else:
        assert mode == "external", mode
        first_attempt(command, tmp_path, ranks, rng)


def newest_committed(run_dir: Path) -> str:
    """The newest committed step of ``run_dir`` as the examples print it ("none" if none)."""
    steps = RunDirectory(run_dir).committed_steps() if run_dir.exists() else []
    return str(steps[-1]) if steps else "none"


def newest_committed_per_rank(run_dir: Path, ranks: int) -> str:
    """Each rank's newest committed step of an uncoordinated ``run_dir``, comma-separated."""
    from hpckpt.protocols.uncoordinated import rank_directory

    return ",".join(newest_committed(rank_directory(run_dir, rank)) for rank in range(ranks))
