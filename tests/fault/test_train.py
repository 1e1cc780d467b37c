"""The training example under real SIGKILLs: bitwise equal results, and sharded N->M restarts."""

from __future__ import annotations

import random
import re
import sys

import pytest

from tests.fault.helpers import relaunched, run, seeds
from tests.fault.test_heat_faults import RANKS
from tests.fault.trials import MODES, newest_committed, seeded_first_attempt
from tests.helpers import BACKENDS

TRAIN_DONE = re.compile(
    r"^train: done steps=(\d+) resumed_from=([\w,]+) loss=(\S+) checksum=([0-9a-f]{64})$", re.M
)


def train_command(ranks: int, run_dir, *args: str, steps: int = 120, every: int = 10) -> list[str]:
    return [
        "mpiexec", "-n", str(ranks), sys.executable, "-m", "hpckpt.examples.train",
        "--steps", str(steps), "--every", str(every), "--dir", str(run_dir), *args,
    ]


def finished(result) -> re.Match:
    assert result.returncode == 0, result.stderr[-3000:]
    match = TRAIN_DONE.search(result.stdout)
    assert match, result.stdout + result.stderr[-3000:]
    return match


@pytest.fixture(scope="module")
def train_reference(tmp_path_factory) -> str:
    return finished(run(train_command(RANKS, tmp_path_factory.mktemp("train") / "clean", every=0))).group(4)


@pytest.mark.parametrize("seed", seeds(3))
def test_random_kills_resume_training_from_the_newest_committed_step(seed, tmp_path, train_reference):
    rng = random.Random(3000 + seed)
    run_dir = tmp_path / "ckpt"
    command = train_command(RANKS, run_dir, "--backend", BACKENDS[seed % len(BACKENDS)])
    crash = ("--crash-at-step", "train.step")
    seeded_first_attempt(command, tmp_path, RANKS, rng, MODES[seed % 3], crash=crash)
    newest = newest_committed(run_dir)
    match = finished(run(command))
    assert (match.group(2), match.group(4)) == (newest, train_reference)


def test_uncoordinated_training_resumes_bit_for_bit(tmp_path, train_reference):
    command = train_command(
        RANKS, tmp_path / "ckpt", "--protocol", "uncoordinated", "--crash-at-step", "87", "--crash-rank", "1"
    )
    match = finished(run(relaunched(command)))
    assert match.group(4) == train_reference
    assert len(set(match.group(2).split(","))) > 1  # each rank from its own step


def test_sharded_training_restarts_on_fewer_ranks(tmp_path):
    uninterrupted = finished(run(train_command(RANKS, tmp_path / "whole", "--shard")))
    run_dir = tmp_path / "resized"
    crashed = run(train_command(RANKS, run_dir, "--shard", "--crash-at-step", "65"))
    assert crashed.returncode != 0
    middle = run(train_command(3, run_dir, "--shard", "--crash-at-step", "93"))
    assert middle.returncode != 0
    resumed = finished(run(train_command(2, run_dir, "--shard")))
    assert resumed.group(2) == "90"
    expected, got = float(uninterrupted.group(3)), float(resumed.group(3))
    assert abs(got - expected) <= 1e-6 * abs(expected)
