"""A small transformer trained data-parallel with torch (DDP over gloo), its state saved
with hpckpt.torch.TrainingState: killed and relaunched, it ends bit for bit like the run
without a failure, resuming from the newest step committed before the kill."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tests.fault.helpers import JOB_TIMEOUT, relaunched
from tests.processes import run_group

pytest.importorskip(
    "torch", reason="torch is not installed (make install adds it unless HPCKPT_WITH_TORCH=0)"
)
JOB = Path(__file__).resolve().parents[1] / "jobs" / "torch_transformer.py"
DONE = re.compile(
    r"^torch_train: done steps=40 resumed_from=(\w+) loss=\S+ checksum=([0-9a-f]{64})$", re.MULTILINE
)


def train(run_dir: Path, *args: str, relaunch: bool = False):
    command = [
        "mpiexec", "-n", "2", sys.executable, str(JOB), "--dir", str(run_dir),
        "--steps", "40", "--every", "10", *args,
    ]
    return run_group(relaunched(command) if relaunch else command, timeout=JOB_TIMEOUT)


def test_a_killed_transformer_training_resumes_bit_for_bit(tmp_path):
    reference = train(tmp_path / "reference")
    assert reference.returncode == 0, (reference.stdout[-2000:], reference.stderr[-3000:])
    (_, expected), = DONE.findall(reference.stdout)
    crashed = train(tmp_path / "crashed", "--crash-at", "25", relaunch=True)
    assert crashed.returncode == 0, (crashed.stdout[-2000:], crashed.stderr[-3000:])
    assert "hpckpt run: attempt 1/3 failed" in crashed.stderr and "attempt 2/3 succeeded" in crashed.stderr
    assert DONE.findall(crashed.stdout) == [("20", expected)]  # step 20: the newest committed before step 25
    listed = run_group(
        [
            sys.executable, "-m", "hpckpt", "diff",
            str(tmp_path / "reference"), str(tmp_path / "crashed"), "--json",
        ],
        timeout=JOB_TIMEOUT,
    )
    report = json.loads(listed.stdout)
    # every leaf, RNGs too
    assert listed.returncode == 0 and report == {"step": 40, "same": True, "differences": []}


FSDP_JOB = Path(__file__).resolve().parents[1] / "jobs" / "torch_fsdp.py"
THREADS = re.compile(r"^fsdp: rank (\d+) threads before=\[(.*)\] exit=\[(.*)\]$", re.MULTILINE)


def assert_torch_threads_end_before_exit(stdout: str, ranks: int) -> None:
    """Each rank had gloo's threads (rank 0 the store's too) before
    hpckpt.torch.destroy_process_group, and none is left when the interpreter is taken
    apart (torch tearing them down then can abort the process)."""
    threads = {int(rank): (before, left) for rank, before, left in THREADS.findall(stdout)}
    assert sorted(threads) == list(range(ranks)), stdout
    assert all("pt_gloo_runloop" in before and left == "" for before, left in threads.values()), threads
    assert "pt_tcpstore_uv" in threads[0][0], threads


def test_an_fsdp2_sharded_training_state_restores_on_another_number_of_ranks(tmp_path):
    saved = run_group(
        ["mpiexec", "-n", "2", sys.executable, str(FSDP_JOB), "--save", str(tmp_path)], timeout=JOB_TIMEOUT
    )
    assert saved.returncode == 0, (saved.stdout[-2000:], saved.stderr[-3000:])
    assert_torch_threads_end_before_exit(saved.stdout, 2)
    inspected = run_group(
        [sys.executable, "-m", "hpckpt", "inspect", str(tmp_path / "ckpt"), "--json"], timeout=JOB_TIMEOUT
    )
    tree = json.loads(inspected.stdout)
    leaves = {leaf["path"]: leaf for leaf in tree["leaves"]}
    shards = leaves["model/0.weight"]
    assert shards["kind"] == "distributed" and [b["offset"] for b in shards["blocks"]] == [[0, 0], [5, 0]]
    assert leaves["optimizers/0/state/0/exp_avg"]["kind"] == "distributed"  # the moments are sharded too
    checked = run_group(
        ["mpiexec", "-n", "3", sys.executable, str(FSDP_JOB), "--check", str(tmp_path)], timeout=JOB_TIMEOUT
    )
    assert checked.returncode == 0, (checked.stdout[-2000:], checked.stderr[-3000:])
    assert "fsdp: restored step 6 on 3 ranks: 16 tensors bit for bit" in checked.stdout
    assert_torch_threads_end_before_exit(checked.stdout, 3)
