"""When to checkpoint: every N steps, every T seconds, or at Young/Daly's optimal interval.

Give a :class:`Schedule` to the :class:`~hpckpt.Checkpointer` and ask
``checkpointer.due(step)`` once per step on every rank. Step-based schedules need no
communication; time-based ones agree with one small all-reduce per call (the largest
elapsed time and checkpoint cost over the ranks), so every rank gets the same answer.

``auto``: the interval is Daly's higher-order estimate of the optimum,
``sqrt(2 C M) (1 + sqrt(C / 2M) / 3 + C / 18M) - C`` for ``C < 2M`` (else ``M``), where ``C``
is the mean cost of the last three checkpoints as measured (the time the application
was blocked, slowest rank) and ``M`` the mean time between failures (``mtbf`` or the
``HPCKPT_MTBF`` environment variable, seconds). Each new interval is logged on the
``hpckpt`` logger (rank 0) and kept in :attr:`Schedule.interval_seconds`.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from ._checks import require_count

if TYPE_CHECKING:
    from mpi4py import MPI

LOG = logging.getLogger("hpckpt")
MTBF_ENV = "HPCKPT_MTBF"
_FIRST_COST_GUESS = 1.0  # seconds, until a checkpoint has been measured


def daly_interval(cost: float, mtbf: float) -> float:
    """Daly's optimal compute time between checkpoints, in seconds."""
    if cost <= 0:
        raise ValueError(f"checkpoint cost must be > 0 s, got {cost}")
    if mtbf <= 0:
        raise ValueError(f"mean time between failures must be > 0 s, got {mtbf}")
    if cost >= 2 * mtbf:
        return mtbf
    ratio = cost / (2 * mtbf)
    return math.sqrt(2 * cost * mtbf) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - cost


class Schedule:
    """A checkpoint schedule: exactly one of ``steps``, ``seconds`` or ``auto=True``.

    Parameters
    ----------
    steps
        Due when ``step % steps == 0``.
    seconds
        Due when this many seconds have passed since the last checkpoint.
    auto
        Due at Daly's interval from the measured cost and ``mtbf``.
    mtbf
        Mean time between failures in seconds, for ``auto`` (default: ``HPCKPT_MTBF``).
    """

    def __init__(
        self,
        *,
        steps: int | None = None,
        seconds: float | None = None,
        auto: bool = False,
        mtbf: float | None = None,
    ) -> None:
        if sum((steps is not None, seconds is not None, auto)) != 1:
            raise ValueError("give exactly one of steps=N, seconds=T or auto=True")
        if steps is not None:
            require_count(steps, "steps", 1)
        if seconds is not None and not seconds > 0:
            raise ValueError(f"seconds must be > 0, got {seconds!r}")
        if auto and mtbf is None:
            text = os.environ.get(MTBF_ENV)
            if not text:
                raise ValueError(
                    f"auto=True needs the mean time between failures: mtbf=SECONDS or {MTBF_ENV}")
            try:
                mtbf = float(text)
            except ValueError as exc:
                raise ValueError(f"{MTBF_ENV}={text!r} is not a number of seconds") from exc
        if mtbf is not None and not mtbf > 0:
            raise ValueError(f"mtbf must be > 0 seconds, got {mtbf!r}")
        self.steps, self.auto, self.mtbf = steps, auto, mtbf
        self.interval_seconds = (daly_interval(_FIRST_COST_GUESS, mtbf) if mtbf is not None and auto
                                 else seconds)
        self._costs: deque[float] = deque(maxlen=3)
        self._pending_cost = 0.0
        self._last = time.monotonic()

    def due(self, step: int, comm: MPI.Comm) -> bool:
        """Whether to checkpoint at ``step``. Collective over ``comm`` for time-based schedules."""
        if self.steps is not None:
            return step % self.steps == 0
        assert self.interval_seconds is not None  # time-based: given, or Daly's from the MTBF
        from mpi4py import MPI

        local = np.array([time.monotonic() - self._last, self._pending_cost], dtype=np.float64)
        agreed = np.empty(2, dtype=np.float64)
        comm.Allreduce(local, agreed, op=MPI.MAX)
        elapsed, cost = float(agreed[0]), float(agreed[1])
        if cost > 0:  # a checkpoint was taken since the last call: its cost on the slowest rank
            self._pending_cost = 0.0
            self._costs.append(cost)
            if self.auto:
                self._retune(comm.rank)
        return elapsed >= self.interval_seconds

    def _retune(self, rank: int) -> None:
        assert self.mtbf is not None and self.interval_seconds is not None  # auto: both known
        mean = sum(self._costs) / len(self._costs)
        interval = daly_interval(mean, self.mtbf)
        if abs(interval - self.interval_seconds) > 0.1 * self.interval_seconds and rank == 0:
            LOG.info("hpckpt: checkpoint interval %.3g s (cost %.3g s, MTBF %.3g s, Daly)",
                     interval, mean, self.mtbf)
        self.interval_seconds = interval

    def saved(self, cost: float) -> None:
        """Record that a checkpoint was just taken, blocking the application ``cost`` seconds."""
        self._pending_cost = max(cost, 1e-9)
        self._last = time.monotonic()
