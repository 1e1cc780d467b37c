"""torch scripts launched as the docs say (docs/torch.md): under mpiexec with
hpckpt.torch.init_process_group; under torchrun, refused on every process with the way
to launch (and, in this process with torchrun's environment set, only a world larger
than one); the page's example script killed, relaunched and bit for bit."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from tests.fault.helpers import JOB_TIMEOUT, relaunched
from tests.processes import run_group

pytest.importorskip(
    "torch", reason="torch is not installed (make install adds it unless HPCKPT_WITH_TORCH=0)"
)
REPO = Path(__file__).resolve().parents[2]
LAUNCH_JOB = REPO / "tests" / "jobs" / "torch_launch.py"
EXAMPLE = REPO / "docs" / "examples" / "torch_train.py"
DONE = re.compile(r"^torch_train: step 20 best_val_loss (\S+) weights ([0-9a-f]{64})$", re.MULTILINE)


def test_init_process_group_gives_torch_the_mpi_ranks_and_a_gloo_allreduce_works(tmp_path):
    ran = run_group(["mpiexec", "-n", "2", sys.executable, str(LAUNCH_JOB), "--dir", str(tmp_path / "run")],
                    timeout=JOB_TIMEOUT)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "torch_launch: ranks=2 sum=3 local_ranks=0,1 saved=1" in ran.stdout  # 1 + 2 over gloo


def test_torchrun_is_refused_on_every_process_with_the_way_to_launch(tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    assert torchrun.is_file(), f"{torchrun} is missing: torch installs it"
    ran = run_group([str(torchrun), "--nproc_per_node", "2", str(LAUNCH_JOB), "--dir", str(tmp_path / "run")],
                    timeout=JOB_TIMEOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert ran.returncode != 0
    refused = re.findall(r"^torch_launch: rank (\d): this process was started by torchrun .*$",
                         ran.stdout, re.MULTILINE)
    assert sorted(refused) == ["0", "1"], ran.stdout + ran.stderr[-3000:]
    for line in ran.stdout.splitlines():
        assert "mpiexec -n 2 python SCRIPT" in line and "hpckpt.torch.init_process_group" in line
    assert "in use by another job" not in ran.stdout + ran.stderr


def train(run_dir: Path, *, kill: bool = False):
    command = ["mpiexec", "-n", "2", sys.executable, str(EXAMPLE), "--dir", str(run_dir),
               "--steps", "20", "--every", "5"]
    env = {**os.environ, "HPCKPT_FAULT": "save.write:1:kill:3"} if kill else None  # rank 1, 3rd save
    return run_group(relaunched(command) if kill else command, timeout=JOB_TIMEOUT, env=env)


def test_the_documented_example_resumes_bit_for_bit_after_a_kill(tmp_path):
    reference = train(tmp_path / "reference")
    assert reference.returncode == 0, reference.stderr[-3000:]
    expected = DONE.findall(reference.stdout)
    assert len(expected) == 1, reference.stdout
    killed = train(tmp_path / "killed", kill=True)
    assert killed.returncode == 0, killed.stderr[-3000:]
    assert "hpckpt run: attempt 1/3 failed" in killed.stderr and "attempt 2/3 succeeded" in killed.stderr
    assert DONE.findall(killed.stdout) == expected  # the weights and the best loss read back
    listed = run_group([sys.executable, "-m", "hpckpt", "diff", str(tmp_path / "reference"),
                        str(tmp_path / "killed"), "--json"], timeout=JOB_TIMEOUT)
    # every leaf the same: torch's generator (the only one saved) and the prefetched batch too
    assert json.loads(listed.stdout) == {"step": 20, "same": True, "differences": []}, listed.stderr


@pytest.mark.parametrize("world", ["1", ""])
def test_a_torchrun_world_of_one_or_without_world_size_is_not_refused(tmp_path, monkeypatch, world):
    """Only a larger torchrun world is refused: ``torchrun --nproc_per_node 1`` may save."""
    from mpi4py import MPI

    import hpckpt

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    monkeypatch.setenv("WORLD_SIZE", world)
    with hpckpt.Checkpointer(tmp_path / "run", comm=MPI.COMM_SELF, backend="posix") as checkpointer:
        checkpointer.save(1, {"x": 1})


def test_a_larger_torchrun_world_is_refused_before_the_run_directory_is_taken(tmp_path, monkeypatch):
    from mpi4py import MPI

    import hpckpt

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    with pytest.raises(hpckpt.HpckptError, match=r"started by torchrun .*WORLD_SIZE=4, RANK=3.*mpiexec -n 4"):
        hpckpt.Checkpointer(tmp_path / "run", comm=MPI.COMM_SELF, backend="posix")
    assert not (tmp_path / "run").exists()
