"""What each thread of this process is doing in a save: its phase, the file it is
writing or syncing, and the bytes it has written so far.

A thread whose storage stops answering cannot say so itself; another thread (the
application's, agreeing whether a background save must be given up) reads its
:class:`Activity` to name the phase, the file and the progress (see
:mod:`hpckpt.engines.background`). Updating it costs a dictionary lookup per phase and
per write call.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field


@dataclass
class Activity:
    """One thread's place in a save."""

    phase: str = ""
    path: str = ""  # the file whose I/O has not returned yet, or ""
    written: int = 0  # bytes this thread has written in the current save
    since: float = field(default_factory=time.monotonic)  # when it entered ``path`` (or the phase)

    def enter_phase(self, phase: str) -> None:
        """Start ``phase`` (not inside a file yet)."""
        self.phase, self.path, self.since = phase, "", time.monotonic()

    def enter_file(self, path: str) -> None:
        """Start writing or syncing ``path``."""
        self.path, self.since = path, time.monotonic()

    def leave_file(self) -> None:
        """The I/O on the file has returned: the thread waits on something else now."""
        self.path, self.since = "", time.monotonic()

    def describe(self) -> str:
        """One line: the phase, the file, the bytes so far, for how long, on which host."""
        where = f", in {self.path}" if self.path else ""
        return (f"phase {self.phase!r}{where}, {self.written} bytes written so far, "
                f"no progress for {time.monotonic() - self.since:.0f} s (on {socket.gethostname()})")


_activities: dict[int, Activity] = {}


def current() -> Activity:
    """The calling thread's activity (made at its first call)."""
    ident = threading.get_ident()
    activity = _activities.get(ident)
    if activity is None:
        activity = _activities[ident] = Activity()
    return activity


def new_save() -> Activity:
    """The calling thread's activity, reset for a new save."""
    activity = _activities[threading.get_ident()] = Activity()
    return activity


def of_thread(ident: int | None) -> Activity | None:
    """The activity of thread ``ident``, None when it never reported one."""
    return None if ident is None else _activities.get(ident)
