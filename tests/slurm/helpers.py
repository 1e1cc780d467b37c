"""Helpers of the Slurm tests: submit the jobs/ scripts to the session's cluster (tests/slurm/conftest.py),
follow the jobs, read their results."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.processes import run_group
from tests.slurm.cluster import SlurmCluster

JOBS = Path(__file__).resolve().parents[2] / "jobs"
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED"}
HEAT_DONE = re.compile(r"^heat: done iters=\d+ resumed_from=(\w+) checksum=([0-9a-f]{64})$", re.MULTILINE)


@dataclass
class Job:
    """A job submitted with sbatch from ``workdir``; ``prefix`` names its output files."""

    cluster: SlurmCluster
    job_id: str
    workdir: Path
    prefix: str
    released: int = 0
    states: list[str] = field(default_factory=list)
    _held_since: float | None = None  # when a requeued run was first seen held (wall clock)

    def scontrol(self, *args: str) -> str:
        result = subprocess.run(["scontrol", *args], capture_output=True, text=True, env=self.cluster.env)
        assert result.returncode == 0, f"scontrol {' '.join(args)}: {result.stderr}"
        return result.stdout

    def steps_alive(self) -> bool:
        """Whether a slurmstepd of this job still runs (named ``slurmstepd: [JOB.STEP]``)."""
        pattern = f"slurmstepd: \\[{self.job_id}\\."
        return subprocess.run(["pgrep", "-f", pattern], capture_output=True).returncode == 0

    def show(self) -> dict[str, str]:
        """``scontrol show job``'s fields."""
        return dict(re.findall(r"(\w+)=(\S*)", self.scontrol("show", "job", "-o", self.job_id)))

    @property
    def stdout(self) -> str:
        return (self.workdir / f"{self.prefix}-{self.job_id}.out").read_text()

    @property
    def stderr(self) -> str:
        path = self.workdir / f"{self.prefix}-{self.job_id}.err"
        return path.read_text() if path.exists() else ""

    def wait_until(self, predicate, timeout: float, what: str) -> dict[str, str]:
        """Poll ``scontrol show job`` until ``predicate(fields)``, releasing requeued holds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            fields = self.show()
            if not self.states or self.states[-1] != fields["JobState"]:
                self.states.append(fields["JobState"])
            if predicate(fields):
                return fields
            held = fields["JobState"] == "PENDING" and fields.get("Reason") == "BeginTime"
            if not held:
                self._held_since = None
            elif self._held_since is None:
                self._held_since = time.time()
            elif self._releasable() and not self.steps_alive():
                # Slurm holds a requeued job for about two minutes; start it now that the
                # previous run's steps are gone (an immediate restart can meet their leftovers).
                self.scontrol("update", f"JobId={self.job_id}", "StartTime=now")
                self.released += 1
                self._held_since = None
            time.sleep(0.2)
        raise AssertionError(f"not {what} after {timeout:g} s: {self.report()}")

    def _releasable(self) -> bool:
        """Whether the held job may start: slurmd refuses ("Job N already killed, do not
        launch batch job", exit 1 at once) a credential created in the same second as, or
        before, the revocation of the previous run's (whole seconds, ``ctime <= revoked``);
        that revocation came before Slurm showed the hold, so wait for the next second."""
        return self._held_since is not None and int(time.time()) > int(self._held_since)

    def wait_completed(self, timeout: float = 50) -> dict[str, str]:
        """Wait for COMPLETED, the one final state a requeued job never passes through."""
        return self.wait_until(lambda f: f["JobState"] == "COMPLETED", timeout, "COMPLETED")

    def wait_done(self, timeout: float = 50) -> dict[str, str]:
        """Wait for a final state and for the job's steps to end. Only for a job that does
        not requeue itself (HPCKPT_REQUEUE=0): one that does passes through FAILED (use
        :meth:`wait_completed`)."""
        self.wait_until(lambda f: f["JobState"] in FINAL_STATES, timeout, "finished")
        return self.wait_until(lambda _: not self.steps_alive(), timeout, "without running steps")

    def report(self) -> str:
        """The job's states as seen, its fields now, and the ends of its output files."""
        logs = self.cluster.root / "log"
        ctld = (logs / "slurmctld.log").read_text().splitlines()
        mentions = [line for line in ctld if f"JobId={self.job_id} " in line + " "]
        slurmd = [line for path in sorted(logs.glob("slurmd*.log")) for line in path.read_text().splitlines()]
        mentions += [line for line in slurmd if any(f"{j} {self.job_id} " in line for j in ("Job", "job"))]
        return (
            f"job {self.job_id}: states {self.states}, released {self.released} times; "
            f"now {self.show()}\n"
            f"stdout:\n{self.stdout[-2000:]}\nstderr:\n{self.stderr[-3000:]}\n"
            "slurmctld.log and slurmd logs:\n" + "\n".join(mentions[-40:])
        )

    def heat_done(self) -> tuple[str, str]:
        """The (resumed_from, checksum) of the job's last ``heat: done`` line, which ends stdout."""
        lines = self.stdout.strip().splitlines()
        match = HEAT_DONE.match(lines[-1]) if lines else None
        assert match, (
            f"stdout does not end with 'heat: done':\n{self.stdout[-3000:]}\nstderr:\n{self.stderr[-3000:]}"
        )
        return match.group(1), match.group(2)


def submit(
    cluster: SlurmCluster,
    script: str,
    workdir: Path,
    *sbatch_args: str,
    env: dict[str, str],
    command: Sequence[str] = (),
) -> Job:
    """``sbatch`` a jobs/ script from ``workdir`` with ``env`` exported (HPCKPT_PYTHON set),
    ``command`` after the script (jobs/app.sbatch runs it)."""
    workdir.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        ["sbatch", "--parsable", *sbatch_args, str(JOBS / script), *command],
        capture_output=True,
        text=True,
        cwd=workdir,
        env={**cluster.env, "HPCKPT_PYTHON": sys.executable, **env},
    )
    assert result.returncode == 0, f"sbatch {script}: {result.stderr}"
    prefix = "hpckpt-" + next((name for name in ("train", "app") if script.startswith(name)), "heat")
    return Job(cluster, result.stdout.strip().split(";")[0], workdir, prefix)


def committed_steps(run_dir: Path) -> list[int]:
    """Steps ``hpckpt ls`` reports as committed."""
    result = subprocess.run(
        [sys.executable, "-m", "hpckpt", "ls", "--json", str(run_dir)], capture_output=True, text=True
    )
    if result.returncode != 0:
        return []
    return [entry["step"] for entry in json.loads(result.stdout) if entry["status"] == "committed"]


def heat_reference(workdir: Path, *args: str) -> str:
    """The checksum of a fault-free one-rank run without checkpoints."""
    solver = [sys.executable, "-m", "hpckpt.examples.heat", "--dir", str(workdir), *args, "--every", "0"]
    result = run_group(["mpiexec", "-n", "1", *solver], timeout=60)
    assert result.returncode == 0, result.stderr
    return HEAT_DONE.search(result.stdout).group(2)
