"""A torch script launched by srun in a real Slurm (jobs/app.sbatch, srun as the
launcher): hpckpt.torch.init_process_group gives torch.distributed the ranks of the job
step, a gloo all-reduce runs over them, and a Checkpointer saves on the same ranks."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.slurm.helpers import submit

pytest.importorskip(
    "torch", reason="torch is not installed (make install adds it unless HPCKPT_WITH_TORCH=0)"
)
LAUNCH_JOB = Path(__file__).resolve().parents[1] / "jobs" / "torch_launch.py"


def test_init_process_group_under_srun(slurm, tmp_path):
    job = submit(slurm, "app.sbatch", tmp_path, "-n", "2", env={"HPCKPT_LAUNCHER": "srun"},
                 command=[sys.executable, str(LAUNCH_JOB), "--dir", str(tmp_path / "run")])
    fields = job.wait_completed()
    assert fields["ExitCode"] == "0:0", job.report()
    assert "hpckpt run: attempt 1/1: srun " in job.stderr, job.report()
    assert re.search(r"^torch_launch: ranks=2 sum=3 local_ranks=\d,\d saved=1$", job.stdout, re.MULTILINE), \
        job.report()
