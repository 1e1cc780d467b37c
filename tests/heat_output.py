"""The heat solver's last line, read by the tests that run it (tests/fault, tests/ulfm)."""

from __future__ import annotations

import re
from dataclasses import dataclass

DONE = re.compile(r"^heat: done iters=(\d+) resumed_from=([\w,]+) checksum=([0-9a-f]{64})$", re.MULTILINE)


@dataclass
class Finished:
    """A finished heat job: its exit status and output."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def checksum(self) -> str:
        match = DONE.search(self.stdout)
        assert match, f"no 'heat: done' line; stdout:\n{self.stdout}\nstderr:\n{self.stderr[-3000:]}"
        return match.group(3)

    @property
    def resumed_from(self) -> str:
        return DONE.search(self.stdout).group(2)

    @property
    def failed_attempts(self) -> int:
        return len(re.findall(r"^hpckpt run: attempt \d+/\d+ failed", self.stderr, re.MULTILINE))
