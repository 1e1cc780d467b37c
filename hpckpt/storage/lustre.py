"""Lustre-like parallel file systems: striping of step directories and the settings it implies.

``Checkpointer(..., striping={"count": 8, "size": 1 << 20})`` says how new step
directories are striped: ``lfs setstripe -c COUNT -S SIZE`` is applied to each one when
the ``lfs`` command exists (elsewhere the striping only sets defaults), and each
backend's defaults follow it unless given explicitly (``Backend.striped_options``):

- hdf5: datasets of 64 KiB or more aligned to the stripe size, so that no two ranks'
  hyperslabs share a stripe needlessly;
- posix: ranks sharing a file start their segments at multiples of the stripe size;
- adios2: one subfile per stripe target (``NumAggregators`` = count, two-level
  aggregation), so the aggregators spread over the object storage targets.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .._checks import require_count


@dataclass(frozen=True)
class Striping:
    """Stripe ``count`` (object storage targets per file) and ``size`` (bytes per stripe)."""

    count: int
    size: int

    @classmethod
    def of(cls, value: Striping | dict[str, int] | None) -> Striping | None:
        """A Striping from ``{"count": C, "size": S}`` (or None); ValueError naming what is wrong."""
        if value is None or isinstance(value, Striping):
            return value
        if not isinstance(value, dict) or set(value) != {"count", "size"}:
            raise ValueError(f"striping must be a dict with keys 'count' and 'size', got {value!r}")
        count, size = value["count"], value["size"]
        for name, number in (("count", count), ("size", size)):
            require_count(number, f"striping {name}", 1)
        if size % 65536:
            raise ValueError(f"striping size must be a multiple of 64 KiB (Lustre's rule), got {size}")
        return cls(count, size)


def set_stripe(directory: Path, striping: Striping) -> None:
    """``lfs setstripe`` on ``directory`` when ``lfs`` exists; new files inherit it. Not collective."""
    lfs = shutil.which("lfs")
    if lfs is None:
        return
    command = [lfs, "setstripe", "-c", str(striping.count), "-S", str(striping.size), str(directory)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        reason = result.stderr.strip() or f"exit status {result.returncode}"
        raise OSError(f"{' '.join(command)} failed: {reason}")
