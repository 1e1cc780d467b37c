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
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, TypedDict

from ._checks import require_count
from .levels.store import REDUNDANCY
from .protocols import PROTOCOLS
from .recovery.ulfm import RECOVERY_MODES
from .schedule import Schedule
from .storage import Backend, backend_class, backend_names, open_backend
from .storage.lustre import Striping
from .storage.retention import KeepBest, KeepNewest, RetentionPolicy

if TYPE_CHECKING:
    from typing_extensions import Unpack

ON_FAILURE = ("raise", "warn")


def _repairable(name: str) -> bool:
    """Whether the backend registered as ``name`` can save over a communicator ULFM repaired."""
    return backend_class(name).capabilities.repairable_in_job


@dataclass(frozen=True)
class Retention:
    """Which committed steps stay: the ``keep`` newest (>= 1), plus the ``keep_best``
    steps with the best metric (``best``: ``"min"`` or ``"max"``).
    """

    keep: int = 3
    keep_best: int = 0
    best: str = "min"

    def __post_init__(self) -> None:
        require_count(self.keep, "keep", 1)
        require_count(self.keep_best, "keep_best", 0)
        if self.best not in ("min", "max"):
            raise ValueError(f"best must be 'min' or 'max', got {self.best!r}")

    def policies(self) -> tuple[RetentionPolicy, ...]:
        """These rules as the retention policies of :mod:`hpckpt.storage.retention`."""
        return (KeepNewest(self.keep), KeepBest(self.keep_best, self.best))


@dataclass(frozen=True)
class Storage:
    """Where and how steps are written: the backend (a name or an object) and its
    options, the Lustre striping of new step directories, and incremental saves (a full
    step every ``incremental`` saves; 0: always full).
    """

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
        """The backend's registered name, or a backend object's ``name``."""
        return self.backend if isinstance(self.backend, str) else self.backend.name

    @property
    def backend_type(self) -> type[Backend]:
        """The backend's class (a named backend's module is imported, not its library)."""
        return backend_class(self.backend) if isinstance(self.backend, str) else type(self.backend)

    def open_backend(self) -> Backend:
        """The backend, made with its options tuned for the striping (see
        :func:`~hpckpt.storage.open_backend`).
        """
        return open_backend(self.backend, self.backend_options, self.striping)


@dataclass(frozen=True)
class NodeLocal:
    """Multi-level checkpointing: every save to node-local storage under ``directory``
    (``"default"``: ``/dev/shm/hpckpt-<hash of the run directory>``) with ``redundancy``
    (``"none"``, ``"partner"``, ``"xor"`` over groups of ``group_size`` ranks), and
    every ``flush_every``-th save also to the run directory (0: never).
    """

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
    combination that cannot work.
    """

    protocol: str = "coordinated"
    retention: Retention = field(default_factory=Retention)
    storage: Storage = field(default_factory=Storage)
    node_local: NodeLocal | None = None
    recovery: str | None = None
    durable_determinants: bool = False
    max_in_flight: int = 1
    max_staging_bytes: int | None = None
    schedule: Schedule | None = None
    on_failure: str = "raise"
    max_failed_saves: int = 5

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {self.protocol!r}; available: {', '.join(PROTOCOLS)}")
        require_count(self.max_in_flight, "max_in_flight", 1)
        if self.max_staging_bytes is not None:
            require_count(self.max_staging_bytes, "max_staging_bytes", 1, meaning="bytes, or None: no budget")
        if self.on_failure not in ON_FAILURE:
            raise ValueError(f"on_failure must be one of {', '.join(map(repr, ON_FAILURE))}, "
                             f"got {self.on_failure!r}")
        require_count(self.max_failed_saves, "max_failed_saves", 1)
        if self.schedule is not None and not isinstance(self.schedule, Schedule):
            raise ValueError(f"schedule must be an hpckpt.Schedule, got {self.schedule!r}")
        coordinated_only = [name for name, used in (
            ("incremental saves", self.storage.incremental),
            ("local_dir and redundancy (node-local levels)", self.node_local is not None),
        ) if used]
        if coordinated_only and self.protocol != "coordinated":
            raise ValueError(f"{coordinated_only[0]} work with the coordinated protocol only")
        if self.durable_determinants and self.protocol != "uncoordinated":
            raise ValueError("durable_determinants applies to the uncoordinated protocol only")
        if self.recovery is not None:
            if self.recovery not in RECOVERY_MODES:
                raise ValueError(
                    f"unknown recovery {self.recovery!r}; available: {', '.join(RECOVERY_MODES)} (or None)"
                )
            if not self.storage.backend_type.capabilities.repairable_in_job:
                able = " or ".join(repr(name) for name in backend_names() if _repairable(name))
                raise ValueError(
                    f"recovery='ulfm' works with backend={able} only "
                    f"(got backend={self.storage.backend_name!r}); "
                    "collective-I/O backends (hdf5, adios2) are not supported yet"
                )

    @classmethod
    def from_keywords(cls, **keywords: Unpack[OptionKeywords]) -> Options:
        """The options named by the flat keyword arguments of :class:`~hpckpt.Checkpointer`
        (:class:`~hpckpt.options.OptionKeywords`); the ones not given take the dataclasses' defaults.
        """
        unknown = sorted(set(keywords) - set(OptionKeywords.__annotations__))
        if unknown:
            raise TypeError(f"unknown option {unknown[0]!r}; "
                            f"the options are {', '.join(OptionKeywords.__annotations__)}")
        given: dict[str, Any] = dict(keywords)

        def part(kind: type, renamed: dict[str, str] | None = None) -> Any:
            names = {renamed.get(f.name, f.name) if renamed else f.name: f.name for f in fields(kind)}
            return kind(**{names[key]: given.pop(key) for key in list(given) if key in names})

        node_local = None
        if given.get("local_dir") is not None or given.get("redundancy") is not None:
            given["local_dir"] = given.get("local_dir") or "default"
            given["redundancy"] = given.get("redundancy") or "none"
            node_local = part(NodeLocal, {"directory": "local_dir"})
        for key in ("local_dir", "redundancy", "group_size", "flush_every"):
            given.pop(key, None)  # without a node-local level they have no effect
        return cls(retention=part(Retention), storage=part(Storage), node_local=node_local, **given)


class OptionKeywords(TypedDict, total=False):
    """The keyword arguments of :class:`~hpckpt.Checkpointer`, each a shortcut for a field
    of :class:`Options` or of its parts.

    backend
        A registered backend name (``"hdf5"``: one parallel HDF5 file per step;
        ``"adios2"``: one ADIOS2 BP5 directory per step; ``"posix"``: raw files, one
        per rank) or a backend object (see :mod:`hpckpt.storage.base`). Default hdf5.
    backend_options
        Keyword arguments of the named backend: for ``"adios2"``, ``parameters``
        (engine parameters such as ``{"NumAggregators": "2"}``); for ``"posix"``,
        ``ranks_per_file``, ``block_alignment``, ``segment_alignment``,
        ``compression`` (``"blosc2"``, lossless) and ``lossy`` (``{"solver/*": 1e-8}``:
        float leaves whose path matches are stored by ZFP within that absolute error;
        only where the application can live with it, see docs/performance.md).
    protocol
        ``"coordinated"`` (default): all ranks save the same step in one call,
        committed globally. ``"uncoordinated"``: each rank saves when it likes, alone;
        messages sent through ``Checkpointer.comm`` are logged so that after a crash
        every rank resumes from its own newest checkpoint (docs/protocols.md).
    keep
        How many of the newest committed steps to keep (at least 1, default 3). Older
        ones are deleted, only after a new step has been committed.
    keep_best, best
        Also keep the ``keep_best`` steps with the best ``metric`` given to
        ``save`` (lowest with ``best="min"``, highest with ``"max"``).
    durable_determinants
        Uncoordinated only: fsync each recorded wildcard-receive outcome, so they
        survive a node failure and not only a process failure (slower).
    max_in_flight
        Most asynchronous saves (``blocking=False``) queued or running at once; each
        holds one copy of the state in host memory (default 1).
    max_staging_bytes
        The most host memory that non-blocking saves and flushes of a node-local level
        hold for their copies of the state (default None: no budget, each save in
        flight holds one copy). A save whose copy does not fit is staged and written
        in parts, blocking longer (docs/reliability.md).
    on_failure
        What a failed save does: ``"raise"`` (default) raises the error on every rank;
        ``"warn"`` records it (``Checkpointer.failures``, the same on every rank), warns
        on rank 0 and lets the application go on, the committed steps untouched; a
        save that cannot start because the storage is stuck is skipped and recorded.
    max_failed_saves
        With ``on_failure="warn"``: after this many failed or abandoned saves in a row
        (default 5; skipped ones are recorded but not counted), the next one raises
        :class:`~hpckpt.SaveFailuresError`.
    local_dir, redundancy, group_size, flush_every
        Multi-level (coordinated only): every save goes to node-local storage under
        ``local_dir`` (``"default"``: ``/dev/shm/hpckpt-<hash of directory>``) with
        ``redundancy`` ``"none"``, ``"partner"`` (a copy on the next node) or ``"xor"``
        (parity over groups of ``group_size`` ranks on distinct nodes, default 4);
        every ``flush_every``-th save (default 1) is also written to the run directory
        with ``backend``, in the background (0: never). Restore takes the newest step
        it can restore completely, from the node-local level (rebuilding lost copies)
        or the file system.
    schedule
        When ``Checkpointer.due`` says to checkpoint (:class:`~hpckpt.schedule.Schedule`:
        every N steps, every T seconds, or Daly's interval from the measured cost).
    striping
        ``{"count": C, "size": S}``: stripe each new step directory over C targets in
        stripes of S bytes (``lfs setstripe`` where ``lfs`` exists) and tune the backend
        for it: dataset alignment (hdf5), segment alignment (posix), one aggregator per
        target (adios2); see ``docs/lustre.md``.
    incremental
        ``k >= 2``: store only the blocks that changed since the newest committed
        step, with a full step every ``k`` saves (0, default: always full).
    recovery
        ``"ulfm"``: when a process dies, the survivors keep running and a replacement
        process (the same program) takes each lost rank's place when it creates its
        Checkpointer (see ``Checkpointer.recover`` and ``docs/ulfm.md``). Needs an MPI
        with ULFM (Open MPI 5 started with ``mpiexec --with-ft ulfm``; a clear error
        otherwise), the posix backend, blocking saves (flushes of a node-local level
        too), and the application communicating through ``Checkpointer.comm`` only.
    """

    backend: str | Backend
    backend_options: dict[str, Any] | None
    protocol: str
    keep: int
    keep_best: int
    best: str
    durable_determinants: bool
    max_in_flight: int
    max_staging_bytes: int | None
    on_failure: str
    max_failed_saves: int
    local_dir: str | os.PathLike[str] | None
    redundancy: str | None
    group_size: int
    flush_every: int
    schedule: Schedule | None
    striping: dict[str, int] | Striping | None
    incremental: int
    recovery: str | None
