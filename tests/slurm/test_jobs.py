"""Submit the jobs/ scripts to a real Slurm and fail, requeue, signal and time them out.

Every job must end with exactly the checksum of a fault-free run, resuming from the
newest checkpoint, and never reach Slurm's TIMEOUT.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import run_group
from tests.slurm.helpers import committed_steps, heat_reference, submit

# A small grid paced to run about 10 s on 2 ranks, checkpointing every 20 iterations.
PACED = ("--n", "96", "--iters", "400", "--every", "20", "--pace", "0.025")
QUICK = ("--n", "96", "--iters", "120", "--every", "10")
USER_APP = Path(__file__).resolve().parents[1] / "jobs" / "user_app.py"


@pytest.fixture(scope="module")
def paced_reference(tmp_path_factory) -> str:
    return heat_reference(tmp_path_factory.mktemp("paced-ref"), *PACED[:4])


@pytest.fixture(scope="module")
def quick_reference(tmp_path_factory) -> str:
    return heat_reference(tmp_path_factory.mktemp("quick-ref"), *QUICK[:4])


@pytest.mark.parametrize("launcher", ["srun", "mpiexec"])
def test_crashed_rank_is_relaunched_in_the_allocation(slurm, tmp_path, quick_reference, launcher):
    heat_args = " ".join((*QUICK, "--crash-at-iter", "55", "--crash-rank", "1"))
    job = submit(
        slurm,
        "heat-relaunch.sbatch",
        tmp_path,
        "-n",
        "4",
        env={"HPCKPT_RUN_DIR": str(tmp_path / "run"), "HEAT_ARGS": heat_args, "HPCKPT_LAUNCHER": launcher},
    )
    fields = job.wait_completed()
    assert fields["ExitCode"] == "0:0", job.report()
    assert job.heat_done() == ("50", quick_reference)
    assert "hpckpt run: attempt 1/4 failed" in job.stderr and "attempt 2/4 succeeded" in job.stderr


def test_scontrol_requeue_mid_run_resumes_from_the_newest_checkpoint(slurm, tmp_path, paced_reference):
    run_dir = tmp_path / "run"
    heat_args = " ".join(PACED)
    # The documented submission, word for word but for the values.
    job = submit(slurm, "heat.sbatch", tmp_path, "-n", "2",
                 f"--export=ALL,HPCKPT_RUN_DIR={run_dir},HEAT_ARGS={heat_args}", env={})
    job.wait_until(
        lambda f: f["JobState"] == "RUNNING" and committed_steps(run_dir), 30, "running with a checkpoint"
    )
    job.scontrol("requeue", job.job_id)
    fields = job.wait_completed()
    assert fields["ExitCode"] == "0:0", job.report()
    assert fields["Restarts"] == "1" and job.released == 1
    stopped = re.search(
        r"^heat: stopped at iteration (\d+) on 2 ranks \(checkpoint step \1\): SIGTERM received$",
        job.stdout,
        re.MULTILINE,
    )
    assert stopped, job.stdout
    assert f"heat: Slurm job {job.job_id}, restart 1;" in job.stdout
    assert job.heat_done() == (stopped.group(1), paced_reference)


def test_time_limit_stops_with_a_checkpoint_and_the_requeued_runs_finish(slurm, tmp_path, paced_reference):
    """--time=1 with the stop margin at 50 s: every run stops about 10 s in, before the limit."""
    run_dir = tmp_path / "run"
    job = submit(
        slurm,
        "heat.sbatch",
        tmp_path,
        "-n",
        "2",
        "--time=1",
        "--signal=B:USR1@40",
        env={"HPCKPT_RUN_DIR": str(run_dir), "HEAT_ARGS": " ".join(PACED), "HPCKPT_STOP_MARGIN": "50"},
    )
    fields = job.wait_completed(timeout=55)
    assert fields["ExitCode"] == "0:0", job.report()
    assert "TIMEOUT" not in job.states
    stops = re.findall(r"^heat: stopped at iteration (\d+) on 2 ranks \(checkpoint step \1\): (.*)$",
                       job.stdout, re.MULTILINE)
    assert stops and int(fields["Restarts"]) == len(stops), job.stdout
    assert all(
        reason == "SIGUSR1 received" or reason.startswith("wall-time limit near") for _, reason in stops
    )
    assert job.stderr.count("requeued Slurm job") == len(stops)
    assert job.heat_done() == (stops[-1][0], paced_reference)


def test_scancel_signal_usr1_checkpoints_and_exits(slurm, tmp_path):
    run_dir = tmp_path / "run"
    job = submit(slurm, "heat.sbatch", tmp_path, "-n", "2",
                 env={"HPCKPT_RUN_DIR": str(run_dir), "HEAT_ARGS": " ".join(PACED), "HPCKPT_REQUEUE": "0"})
    job.wait_until(
        lambda f: f["JobState"] == "RUNNING" and committed_steps(run_dir), 30, "running with a checkpoint"
    )
    subprocess.run(["scancel", "--signal=USR1", "--batch", job.job_id], check=True, env=slurm.env)
    fields = job.wait_done()
    assert fields["ExitCode"] == "75:0" and fields["Restarts"] == "0", job.stderr
    stopped = re.search(
        r"^heat: stopped at iteration (\d+) on 2 ranks \(checkpoint step \1\): SIGUSR1 received$",
        job.stdout,
        re.MULTILINE,
    )
    assert stopped, job.stdout
    assert max(committed_steps(run_dir)) == int(stopped.group(1)) < 400
    assert "stopped with a checkpoint" in job.stderr and "requeue" not in job.stderr


def test_training_job_relaunched_after_a_crash_matches_the_fault_free_run(slurm, tmp_path):
    train = [sys.executable, "-m", "hpckpt.examples.train", "--steps", "120", "--every", "10"]
    reference = run_group(["mpiexec", "-n", "2", *train, "--dir", str(tmp_path / "ref")], timeout=60)
    assert reference.returncode == 0, reference.stderr
    job = submit(
        slurm,
        "train.sbatch",
        tmp_path,
        "-n",
        "2",
        env={
            "HPCKPT_RUN_DIR": str(tmp_path / "run"),
            "HPCKPT_RESTARTS": "1",
            "HPCKPT_LAUNCHER": "mpiexec",
            "TRAIN_ARGS": "--steps 120 --every 10 --crash-at-step 65 --crash-rank 1",
        },
    )
    job.wait_completed()
    last = job.stdout.strip().splitlines()[-1]
    assert last == reference.stdout.strip().splitlines()[-1].replace("resumed_from=none", "resumed_from=60")
    assert "attempt 1/2 failed" in job.stderr


def test_the_generic_script_runs_a_users_own_command_relaunched_after_a_crash(slurm, tmp_path):
    app = [sys.executable, str(USER_APP), "--iters", "60", "--every", "10"]
    reference = run_group(["mpiexec", "-n", "2", *app, "--dir", str(tmp_path / "ref")], timeout=60)
    assert reference.returncode == 0, reference.stderr
    job = submit(
        slurm,
        "app.sbatch",
        tmp_path,
        "-n",
        "2",
        env={"HPCKPT_RESTARTS": "1", "HPCKPT_LAUNCHER": "mpiexec"},
        command=[*app, "--dir", str(tmp_path / "run"), "--crash-at", "35"],
    )
    fields = job.wait_completed()
    assert fields["ExitCode"] == "0:0", job.report()
    last = job.stdout.strip().splitlines()[-1]
    assert last == reference.stdout.strip().splitlines()[-1].replace("resumed_from=None", "resumed_from=30")
    assert f"app.sbatch: job {job.job_id}, restart 0: {' '.join(app)}" in job.stdout
    assert "hpckpt run: attempt 1/2: mpiexec -n 2 " in job.stderr and "attempt 1/2 failed" in job.stderr
