"""Named points on the save, commit and restore paths, where a test harness may act.

The library calls :func:`point` (``"save.write"``, ``"commit.rename"``, ...; the list is
in :mod:`hpckpt.testing.faults`); nothing happens unless a hook is installed. Fault
injection installs one when :mod:`hpckpt.testing.faults` is imported, which ``import
hpckpt`` does when ``HPCKPT_FAULT`` names a fault plan: the protocols never import the
test package.
"""

from __future__ import annotations

from collections.abc import Callable

FAULT_PLAN_ENV = "HPCKPT_FAULT"
ATTEMPT_ENV = "HPCKPT_ATTEMPT"  # set by `hpckpt run` for each relaunch; faults fire in attempt 0 only
FINISHED_FILE_ENV = "HPCKPT_FINISHED_FILE"  # set by `hpckpt run`; Checkpointer.finish creates the file
_hook: Callable[[str], None] | None = None


def install_point_hook(hook: Callable[[str], None] | None) -> Callable[[str], None] | None:
    """Call ``hook(name)`` at every point from now on (None: no hook); returns the hook
    it replaces, for the caller to put back.
    """
    global _hook
    replaced, _hook = _hook, hook
    return replaced


def point(name: str) -> None:
    """Tell the installed hook that this process reached point ``name``; it may act (kill, raise, stop)."""
    if _hook is not None:
        _hook(name)
