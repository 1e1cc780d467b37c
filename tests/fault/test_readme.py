"""The README's first example runs as printed: under ``mpiexec`` it saves, and a second
run restores its last step instead of computing."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from tests.fault.helpers import JOB_TIMEOUT
from tests.processes import run_group

README = Path(__file__).resolve().parents[2] / "README.md"


def first_python_block() -> str:
    match = re.search(r"^```python\n(.*?)^```", README.read_text(), re.S | re.M)
    assert match, "README.md has no python block"
    return match.group(1)


def test_the_readme_example_saves_and_a_second_run_restores_its_last_step(tmp_path):
    solver = tmp_path / "solver.py"
    solver.write_text(first_python_block())
    command = ["mpiexec", "-n", "2", sys.executable, str(solver)]
    first = run_group(command, timeout=JOB_TIMEOUT, cwd=str(tmp_path))
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.stdout.strip() == "iteration 1000: u[0, 0] = 1000.0"
    steps = sorted(path.name for path in (tmp_path / "ckpt").glob("step-*"))
    assert steps == ["step-00000800", "step-00000900", "step-00001000"]  # keep=3
    again = run_group(command, timeout=JOB_TIMEOUT, cwd=str(tmp_path))
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.strip() == "iteration 1000: u[0, 0] = 1000.0"  # restored: nothing was computed
