"""The tutorial (docs/tutorial.md) works as written.

Its plain solver is taken from the page's ``heat1d.py`` block and its checkpointed
solver is ``docs/examples/tutorial_solver.py`` (which the page includes); each command
below must appear on the page as a ``$`` line, and runs here as the page says, with
``python`` and ``hpckpt`` being this interpreter's: on 2 ranks, a rank killed and the
job resumed under ``hpckpt run`` ends bit for bit like the plain solver, and a SIGTERM
stops the job with a checkpoint and exit status 75.
"""

from __future__ import annotations

import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpckpt import CheckpointReader
from tests.processes import run_group, started_group

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "tutorial.md"
SOLVER = REPO / "docs" / "examples" / "tutorial_solver.py"
TIMEOUT = 50  # seconds a command may run before its process group is killed

PLAIN = "mpiexec -n 2 python heat1d.py"
CHECKPOINTED = "mpiexec -n 2 python solver.py"
CRASHED = "hpckpt run --max-restarts 3 -- mpiexec -n 2 python solver.py --ckpt crashed --crash-at 450"
STOPPED = "hpckpt run -- mpiexec -n 2 python solver.py --ckpt stopped --steps 100000 &"
TOOLS = ("hpckpt ls crashed", "hpckpt inspect crashed", "hpckpt verify crashed", "hpckpt diff ckpt crashed")
DONE = re.compile(r"^done: steps=1000 mean=\S+ checksum=([0-9a-f]{16})$", re.MULTILINE)


def page_commands() -> list[str]:
    """The commands the page shows, each ``$ COMMAND`` line without its prompt."""
    return [line[2:] for line in PAGE.read_text().splitlines() if line.startswith("$ ")]


def argv(command: str) -> list[str]:
    """``command`` as the page's reader runs it, with this interpreter as ``python`` and ``hpckpt``."""
    words = shlex.split(command.removesuffix("&"))
    if words[0] == "hpckpt":
        words = [sys.executable, "-m", "hpckpt", *words[1:]]
    return [sys.executable if word == "python" else word for word in words]


def run(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run one of the page's commands in ``cwd``; fail unless the page shows it."""
    assert command in page_commands(), f"docs/tutorial.md does not show `$ {command}`"
    return run_group(argv(command), timeout=TIMEOUT, cwd=str(cwd))


def checksum(stdout: str) -> str:
    match = DONE.search(stdout)
    assert match, f"no 'done' line in:\n{stdout}"
    return match.group(1)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """An empty directory holding the page's two solvers, as the reader saves them."""
    if shutil.which("mpiexec") is None:
        pytest.fail("mpiexec is not on PATH")
    work = tmp_path_factory.mktemp("tutorial")
    block = r"```\{code-block\} python\n:caption: heat1d.py\n\n(.*?)```"
    plain = re.search(block, PAGE.read_text(), re.DOTALL)
    assert plain, "docs/tutorial.md has no code-block captioned heat1d.py"
    (work / "heat1d.py").write_text(plain.group(1))
    shutil.copy(SOLVER, work / "solver.py")
    assert "```{literalinclude} examples/tutorial_solver.py" in PAGE.read_text()
    return work


@pytest.fixture(scope="module")
def plain_checksum(workdir) -> str:
    """Step 1: the solver without checkpoints."""
    result = run(PLAIN, workdir)
    assert result.returncode == 0, result.stderr
    assert f"\n{result.stdout}" in PAGE.read_text(), "the page shows another output of step 1"
    return checksum(result.stdout)


@pytest.fixture(scope="module")
def crashed(workdir):
    """Step 3: the run whose rank 1 is killed, under `hpckpt run`."""
    return run(CRASHED, workdir)


def test_killed_rank_resumes_bit_for_bit(workdir, crashed, plain_checksum):
    """Rank 1 SIGKILLs itself at step 450; `hpckpt run` relaunches the job, which
    restores step 400 and ends with the plain solver's checksum."""
    result = crashed
    assert result.returncode == 0, result.stderr
    failed = re.findall(r"^hpckpt run: attempt \d+/4 failed", result.stderr, re.MULTILINE)
    assert len(failed) == 1, result.stderr
    assert "resumed from step 400\n" in result.stdout and "resumed from step 400\n" in PAGE.read_text()
    assert checksum(result.stdout) == plain_checksum
    assert CheckpointReader(workdir / "crashed").steps() == [900, 1000]


def test_checkpointed_run_and_the_tools(workdir, crashed, plain_checksum):
    """Step 2's run without a crash ends like the plain solver; step 5's tools read the
    crashed run and find it the same as this one."""
    result = run(CHECKPOINTED, workdir)
    assert result.returncode == 0, result.stderr
    assert checksum(result.stdout) == plain_checksum
    outputs = {}
    for command in TOOLS:
        tool = run(command, workdir)
        assert tool.returncode == 0, f"{command}: {tool.stdout}{tool.stderr}"
        outputs[command] = tool.stdout
    assert re.search(r"^\s+1000\s+committed", outputs["hpckpt ls crashed"], re.MULTILINE)
    assert "rank 1: [500:1000]" in outputs["hpckpt inspect crashed"]
    assert "every xxh3_64 checksum matches" in outputs["hpckpt verify crashed"]
    assert "SAME" in outputs["hpckpt diff ckpt crashed"]


def test_sigterm_stops_with_a_checkpoint(workdir):
    """Step 4 without Slurm: SIGTERM to `hpckpt run` makes the ranks save the step they
    are at and exit 75, which is not relaunched."""
    assert STOPPED in page_commands() and "kill -TERM %1" in page_commands()
    run_dir = workdir / "stopped"
    with started_group(argv(STOPPED), cwd=str(workdir)) as process:
        deadline = time.monotonic() + TIMEOUT
        while not list(run_dir.glob("step-*[0-9]")) and process.poll() is None:
            assert time.monotonic() < deadline, "no checkpoint was committed in time"
            time.sleep(0.2)
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=TIMEOUT)
    assert process.returncode == 75, stderr
    stopped = re.search(r"^stopped at step (\d+) \(SIGTERM received\); run me again$", stdout, re.MULTILINE)
    assert stopped, stdout + stderr
    assert "not relaunching" in stderr
    assert CheckpointReader(run_dir).newest() == int(stopped.group(1))
