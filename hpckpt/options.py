"""What a :class:`~hpckpt.Checkpointer` is asked to do, checked in one place.

Every rule about option values and their combinations lives here and runs when the
dataclasses are built: before any communicator is duplicated, any lock taken or any
collective call made, so a wrong option is a ``ValueError`` on every rank that leaves
nothing behind. (What depends on the job itself, such as the number of nodes a
redundancy scheme needs or whether the MPI library has ULFM, is checked where the job
is known, and a failure there releases what was taken.)

``Checkpointer(directory, keep=5, backend="posix")`` builds these from its keyword
arguments; ``Checkpointer(directory, options=Options(retention=Retention(keep=5),
storage=Storage(backend="posix")))`` is the same.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ._checks import require_count
from .levels.store import REDUNDANCY
from .protocols import PROTOCOLS
from .recovery.ulfm import RECOVERY_MODES
from .schedule import Schedule
from .storage import Backend
from .storage.lustre import Striping


@dataclass(frozen=True)
class Retention:
    """Which committed steps stay: the ``keep`` newest (>= 1), plus the ``keep_best``
    steps with the best metric (``best``: ``"min"`` or ``"max"``)."""

    keep: int = 3
    keep_best: int = 0
    best: str = "min"

    def __post_init__(self) -> None:
        require_count(self.keep, "keep", 1)
        require_count(self.keep_best, "keep_best", 0)
        if self.best not in ("min", "max"):
            raise ValueError(f"best must be 'min' or 'max', got {self.best!r}")


@dataclass(frozen=True)
class Storage:
    """Where and how steps are written: the backend (a name or an object) and its
    options, the Lustre striping of new step directories, and incremental saves (a full
    step every ``incremental`` saves; 0: always full)."""

    backend: str | Backend = "hdf5"
    backend_options: dict[str, Any] | None = None
    striping: Striping | None = None
    incremental: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "striping", Striping.of(self.striping))
        require_count(self.incremental, "incremental", 0, meaning="a full step every k saves")
        if self.backend_options is not None and not isinstance(self.backend_options, dict):
            raise ValueError(f"backend_options must be a dict, got {self.backend_options!r}")

    @property
    def backend_name(self) -> str:
        """The backend's name (an object's ``name``, else its class name)."""
        backend = self.backend
        return backend if isinstance(backend, str) else getattr(backend, "name", type(backend).__name__)


@dataclass(frozen=True)
class NodeLocal:
    """Multi-level checkpointing: every save to node-local storage under ``directory``
    (``"default"``: ``/dev/shm/hpckpt-<hash of the run directory>``) with ``redundancy``
    (``"none"``, ``"partner"``, ``"xor"`` over groups of ``group_size`` ranks), and
    every ``flush_every``-th save also to the run directory (0: never)."""

    directory: str | os.PathLike[str] = "default"
    redundancy: str = "none"
    group_size: int = 4
    flush_every: int = 1

    def __post_init__(self) -> None:
        if self.redundancy not in REDUNDANCY:
            raise ValueError(f"redundancy must be one of {', '.join(REDUNDANCY)}, got {self.redundancy!r}")
        require_count(self.group_size, "group_size", 2 if self.redundancy == "xor" else 1)
        require_count(self.flush_every, "flush_every", 0, meaning="0: never flush to the run directory")


@dataclass(frozen=True)
class Options:
    """Everything but the run directory and the communicator (see :class:`~hpckpt.Checkpointer`
    for each option's meaning). Raises ValueError naming the option for a value or a
    combination that cannot work."""

    protocol: str = "coordinated"
    retention: Retention = field(default_factory=Retention)
    storage: Storage = field(default_factory=Storage)
    node_local: NodeLocal | None = None
    recovery: str | None = None
    durable_determinants: bool = False
    max_in_flight: int = 1
    schedule: Schedule | None = None

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {self.protocol!r}; available: {', '.join(PROTOCOLS)}")
        require_count(self.max_in_flight, "max_in_flight", 1)
        if self.schedule is not None and not isinstance(self.schedule, Schedule):
            raise ValueError(f"schedule must be an hpckpt.Schedule, got {self.schedule!r}")
        coordinated_only = [name for name, used in (
            ("incremental saves", self.storage.incremental),
            ("local_dir and redundancy (node-local levels)", self.node_local is not None),
        ) if used]  # fmt: skip
        if coordinated_only and self.protocol != "coordinated":
            raise ValueError(f"{coordinated_only[0]} work with the coordinated protocol only")
        if self.durable_determinants and self.protocol != "uncoordinated":
            raise ValueError("durable_determinants applies to the uncoordinated protocol only")
        if self.recovery is not None:
            if self.recovery not in RECOVERY_MODES:
                raise ValueError(
                    f"unknown recovery {self.recovery!r}; available: {', '.join(RECOVERY_MODES)} (or None)"
                )
            if self.storage.backend_name != "posix":
                raise ValueError(
                    f"recovery='ulfm' works with backend='posix' only (got backend={self.storage.backend_name!r}); "
                    "collective-I/O backends (hdf5, adios2) are not supported yet"
                )

    @classmethod
    def from_keywords(
        cls,
        *,
        backend: str | Backend = "hdf5",
        backend_options: dict[str, Any] | None = None,
        protocol: str = "coordinated",
        keep: int = 3,
        durable_determinants: bool = False,
        max_in_flight: int = 1,
        keep_best: int = 0,
        best: str = "min",
        schedule: Schedule | None = None,
        local_dir: str | os.PathLike[str] | None = None,
        redundancy: str | None = None,
        group_size: int = 4,
        flush_every: int = 1,
        striping: dict[str, int] | Striping | None = None,
        incremental: int = 0,
        recovery: str | None = None,
    ) -> Options:
        """The options the flat keyword arguments of :class:`~hpckpt.Checkpointer` name."""
        node_local = None
        if local_dir is not None or redundancy is not None:
            node_local = NodeLocal(local_dir if local_dir is not None else "default", redundancy or "none",
                                   group_size, flush_every)  # fmt: skip
        return cls(
            protocol=protocol,
            retention=Retention(keep, keep_best, best),
            storage=Storage(backend, backend_options, striping, incremental),  # type: ignore[arg-type]
            node_local=node_local,
            recovery=recovery,
            durable_determinants=durable_determinants,
            max_in_flight=max_in_flight,
            schedule=schedule,
        )
