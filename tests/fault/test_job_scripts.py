"""The plain mpirun scripts in jobs/, for machines without Slurm, run as users run them."""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

from tests.fault.helpers import JOB_TIMEOUT
from tests.heat_output import Finished
from tests.processes import run_group, started_group

JOBS = Path(__file__).resolve().parents[2] / "jobs"


def script_env(run_dir: Path, **settings: str) -> dict[str, str]:
    return {**os.environ, "HPCKPT_PYTHON": sys.executable, "HPCKPT_RUN_DIR": str(run_dir), **settings}


def test_heat_mpirun_script_relaunches_after_a_crash(tmp_path, reference_checksum):
    env = script_env(
        tmp_path / "run", HEAT_ARGS="--n 96 --iters 120 --every 10 --crash-at-iter 75 --crash-rank 3"
    )
    result = run_group(["bash", str(JOBS / "heat-mpirun.sh")],
                            timeout=JOB_TIMEOUT, env=env, cwd=tmp_path)
    finished = Finished(result.returncode, result.stdout, result.stderr)
    assert result.returncode == 0, result.stderr[-3000:]
    outcome = (finished.checksum, finished.resumed_from, finished.failed_attempts)
    assert outcome == (reference_checksum, "70", 1)


def test_sigterm_to_the_mpirun_script_checkpoints_and_exits_75(tmp_path):
    run_dir = tmp_path / "run"
    env = script_env(run_dir, HEAT_ARGS="--n 96 --iters 2000 --every 500 --pace 0.01")
    with started_group(["bash", str(JOBS / "heat-mpirun.sh")], env=env, cwd=tmp_path) as process:
        deadline = time.monotonic() + JOB_TIMEOUT
        while not list(tmp_path.glob(".hpckpt-ready-*")) and time.monotonic() < deadline:
            time.sleep(0.05)  # until the ranks' handlers are in place (hpckpt run's ready file)
        process.send_signal(signal.SIGTERM)  # no checkpoint is due before iteration 500
        stdout, stderr = process.communicate(timeout=JOB_TIMEOUT)
    assert process.returncode == 75, stderr[-3000:]
    stopped = re.search(
        r"^heat: stopped at iteration (\d+) on 4 ranks \(checkpoint step \1\): SIGTERM received$",
        stdout,
        re.MULTILINE,
    )
    assert stopped and 0 < int(stopped.group(1)) < 500, stdout
    assert sorted(os.listdir(run_dir)) == [".hpckpt.lock", f"step-{int(stopped.group(1)):08d}"]


def test_train_mpirun_script_matches_a_plain_run(tmp_path):
    args = "--steps 80 --every 10"
    plain = run_group(["mpiexec", "-n", "4", sys.executable, "-m", "hpckpt.examples.train", *args.split(),
                            "--dir", str(tmp_path / "plain")], timeout=JOB_TIMEOUT)
    result = run_group(
        ["bash", str(JOBS / "train-mpirun.sh")],
        timeout=JOB_TIMEOUT,
        env=script_env(tmp_path / "run", TRAIN_ARGS=args),
        cwd=tmp_path,
    )
    assert plain.returncode == 0 and result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == plain.stdout.strip().splitlines()[-1]


USER_APP = Path(__file__).resolve().parents[1] / "jobs" / "user_app.py"


def test_the_generic_mpirun_script_runs_a_users_own_code_through_a_crash_and_a_failing_exit(tmp_path):
    plain = run_group(
        ["mpiexec", "-n", "2", sys.executable, str(USER_APP), "--dir", str(tmp_path / "plain")],
        timeout=JOB_TIMEOUT,
    )
    assert plain.returncode == 0, plain.stderr[-3000:]
    env = {**os.environ, "HPCKPT_PYTHON": sys.executable, "HPCKPT_NP": "2", "MPIRUN": "mpiexec"}
    crashed = run_group(
        [
            "bash", str(JOBS / "app-mpirun.sh"), sys.executable, str(USER_APP),
            "--dir", str(tmp_path / "run"), "--crash-at", "35",
        ],
        timeout=JOB_TIMEOUT,
        env=env,
        cwd=tmp_path,
    )
    assert crashed.returncode == 0, crashed.stderr[-3000:]
    assert crashed.stdout.strip().splitlines()[-1] == plain.stdout.strip().splitlines()[-1].replace(
        "resumed_from=None", "resumed_from=30")
    assert "hpckpt run: attempt 1/4 failed" in crashed.stderr and "attempt 2/4 succeeded" in crashed.stderr
    aborted = run_group(
        [
            "bash", str(JOBS / "app-mpirun.sh"), sys.executable, str(USER_APP),
            "--dir", str(tmp_path / "aborted"), "--abort-at-exit",
        ],
        timeout=JOB_TIMEOUT,
        env=env,
        cwd=tmp_path,
    )
    assert aborted.returncode != 0 and aborted.stdout.count("user_app: done") == 1, aborted.stderr[-3000:]
    assert "attempt 1/4 finished its work (Checkpointer.finish) but then exited with" in aborted.stderr
    assert "attempt 2/4" not in aborted.stderr
    missing = run_group(["bash", str(JOBS / "app-mpirun.sh")], timeout=JOB_TIMEOUT, env=env, cwd=tmp_path)
    assert missing.returncode == 2 and "give the application's command after the script" in missing.stderr
