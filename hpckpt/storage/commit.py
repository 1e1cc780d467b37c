"""The commit strategy: a step exists only once it is durable and renamed into place.

On disk, a run directory holds::

    step-00000010/            committed: data files + manifest.json
    step-00000020.tmp/        being written (or left by a crash): never restored
    step-00000005.deleting/   being removed by retention: never restored
    .recycle/                 data files (and directories) of the last deleted step,
                              reused by the next save (backends that write in place only)

The sequence for step N: rank 0 ``prepare(N)`` makes an empty ``step-N.tmp``; the
backend writes into it on every rank; every rank makes its own writes durable
(:func:`sync_files`: an fsync through its own node, since on a parallel file system
one node's fsync does not flush another node's cache) and reports the sizes it sees;
rank 0 ``commit`` records the largest size each file had on any writer, writes
``manifest.json`` last, fsyncs it and the directories, renames ``step-N.tmp`` to
``step-N`` (exchanging it atomically with a committed step of the same number) and
fsyncs the run directory. A crash at any moment leaves either the old set of
committed steps or the new one.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path

from .._activity import current
from .._hooks import point
from ..checksum import file_checksum
from ..errors import CorruptCheckpointError, InvalidStateError, NoSpaceError
from ..model.delta import referenced_steps
from ..model.manifest import Manifest, Shard
from .lustre import Striping, set_stripe
from .names import MANIFEST_NAME, committed_steps, step_name

RECYCLE_NAME = ".recycle"


DIRECTORY_MODE = 0o755  # masked by the umask, like every mode here: never world-writable
FILE_MODE = 0o644
SPACE_SLACK = 1 << 20  # bytes a save needs beyond its data: manifest, library metadata, alignment


def _not_world_writable(path: Path) -> None:
    """Clear the world-write bit an I/O library may have set (it creates files 0666 & umask)."""
    mode = os.stat(path).st_mode
    if mode & stat.S_IWOTH:
        os.chmod(path, stat.S_IMODE(mode) & ~(stat.S_IWOTH | stat.S_IWGRP))


def _mib(count: int) -> str:
    return f"{count / 2**20:.1f} MiB"


def _tree_size(path: Path) -> int:
    """Bytes of the regular file ``path``, or of the files under the directory ``path``."""
    if not path.is_dir():
        return path.stat().st_size
    return sum(entry.stat().st_size for entry in path.rglob("*") if entry.is_file())


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_files(directory: Path, names: Iterable[str]) -> dict[str, int]:
    """Fsync the regular files ``names`` under ``directory``; their sizes after the fsync.

    Not collective: every rank calls it for the files it wrote (directories are
    skipped: rank 0 fsyncs them at the commit). The sizes are what this rank sees.
    """
    sizes = {}
    for name in names:
        path = directory / name
        if path.is_dir():
            continue
        activity = current()
        activity.enter_file(str(path))
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            sizes[name] = os.fstat(fd).st_size
        finally:
            os.close(fd)
            activity.leave_file()
    return sizes


def write_durably(path: Path, text: str) -> None:
    """Write ``text`` to the new file ``path`` and fsync it. Not collective. The directory
    entry is made durable by an fsync of the directory: the commit's, or the writer's
    own through :func:`sync_directory` when another node commits.
    """
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    with open(descriptor, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def sync_directory(path: Path) -> None:
    """Fsync the directory ``path`` (the entries this node created in it). Not collective."""
    _fsync_path(path)


def merge_sizes(per_rank: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """Each file's committed size: the largest any writer saw after its own fsync."""
    merged: dict[str, int] = {}
    for sizes in per_rank:
        for name, size in sizes.items():
            merged[name] = max(size, merged.get(name, 0))
    return merged


_RENAME_EXCHANGE = 2  # linux/fs.h


def _exchange(first: Path, second: Path) -> bool:
    """Swap two directory entries atomically (``renameat2(RENAME_EXCHANGE)``); False where
    the kernel or file system cannot.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    at_cwd = -100
    if renameat2(at_cwd, os.fsencode(first), at_cwd, os.fsencode(second), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(code, f"cannot exchange {first} and {second}: {os.strerror(code)}")


def replace_directory(temp: Path, final: Path, *, fault_points: str | None = None) -> None:
    """Put the complete directory ``temp`` at ``final``, durably, so that ``final`` is at
    every moment either its old content or the new one.

    An existing ``final`` is exchanged with ``temp`` atomically (``renameat2``) and then
    removed under the temporary name; where the file system cannot exchange, it is
    renamed to ``final.replaced`` first: in the moment without ``final`` (a crash
    there) listings take ``final.replaced`` for it (:func:`~.names.committed_entries`).
    The parent directory is fsync'd. ``fault_points`` names the prefix of the points
    passed (``PREFIX.exchanged``; ``PREFIX.set_aside`` and ``PREFIX.renamed``).
    """
    if final.exists() and _exchange(temp, final):
        _fsync_path(final.parent)
        if fault_points:
            point(f"{fault_points}.exchanged")
        shutil.rmtree(temp)  # the old content, under the temporary name
        return
    replaced = final.with_name(final.name + ".replaced")
    if final.exists():
        os.replace(final, replaced)
        _fsync_path(final.parent)
        if fault_points:
            point(f"{fault_points}.set_aside")
    os.replace(temp, final)
    if fault_points:
        point(f"{fault_points}.renamed")
    _fsync_path(final.parent)
    if replaced.exists():
        shutil.rmtree(replaced)


class RunDirectory:
    """The committed steps of one run: their paths and listing, the preparation of a
    new step and its atomic commit. Retention is in :mod:`~hpckpt.storage.retention`,
    the integrity checks of committed files in :mod:`~hpckpt.storage.integrity`.

    Not collective: the protocol calls these methods on rank 0 only and shares the
    results.
    """

    def __init__(self, root: str | os.PathLike[str], striping: Striping | None = None) -> None:
        self.root = Path(root)
        self.striping = striping
        self._references: dict[int, frozenset[int]] = {}  # step -> steps it reads blocks of
        self._recycled: set[str] = set()  # entries moved into the step being written
        self._saves: dict[int, int] = {}  # step -> how many saves of it this object began

    def begin(self, step: int) -> None:
        """Count a save of ``step`` beginning. Every rank calls it at the start of each
        save, so that all agree on :meth:`temp_path` without communicating. Not collective.

        A step saved again by this object is written into a directory of a new name
        (``step-N.K.tmp``): a client that caches directory entries (MooseFS, NFS) on
        another node may still resolve ``step-N.tmp`` to the directory that was renamed
        into place by the last commit, and would write into that committed step.
        """
        self._saves[step] = self._saves.get(step, 0) + 1

    def forget_saves(self) -> None:
        """Forget the saves :meth:`begin` counted. Every rank of a communicator repaired in the
        job calls it, so that the survivors agree with the replacements, which counted none.
        Not collective.
        """
        self._saves = {}

    def step_path(self, step: int) -> Path:
        """The directory of committed step ``step``: in place, or its set-aside copy
        where a replacement was interrupted (:func:`~.names.committed_entries`).
        """
        in_place = self.root / step_name(step)
        set_aside = self.root / step_name(step, ".replaced")
        return set_aside if not in_place.exists() and (set_aside / MANIFEST_NAME).exists() else in_place

    def temp_path(self, step: int) -> Path:
        """The directory step ``step`` is written into before its commit: ``step-N.tmp``,
        ``step-N.K.tmp`` for the K-th save of the same step again (see :meth:`begin`).
        """
        again = self._saves.get(step, 1) - 1
        return self.root / step_name(step, f".{again}.tmp" if again else ".tmp")

    def manifest_path(self, step: int) -> Path:
        """The manifest of committed step ``step``."""
        return self.step_path(step) / MANIFEST_NAME

    def committed_steps(self) -> list[int]:
        """The committed steps (:func:`~.names.committed_entries`), oldest first."""
        return committed_steps(self.root)

    def prepare(self, step: int, needed_bytes: int = 0) -> Path:
        """Create an empty temporary directory for ``step`` (removing a stale one).

        Raises :class:`~hpckpt.errors.NoSpaceError`, creating nothing, when the file
        system has less than ``needed_bytes`` plus :data:`SPACE_SLACK` free.
        """
        self.root.mkdir(mode=DIRECTORY_MODE, parents=True, exist_ok=True)
        readers = self.readers_of(step) if self.manifest_path(step).exists() else []
        if readers:
            raise InvalidStateError(
                f"cannot save step {step} again in {self.root}: incremental steps {readers} read blocks "
                "of the committed one; save under a new step number"
            )
        temp = self.temp_path(step)
        if temp.exists():
            shutil.rmtree(temp)
        recycle = self.root / RECYCLE_NAME
        spare: dict[str, int] = {}
        if recycle.is_dir():
            spare = {entry.name: _tree_size(Path(entry.path)) for entry in os.scandir(recycle)}
        free = shutil.disk_usage(self.root).free + sum(spare.values())
        if needed_bytes and free < needed_bytes + SPACE_SLACK:
            steps = self.committed_steps()
            kept = (
                f"committed steps {', '.join(map(str, steps))} are intact"
                if steps
                else "no step is committed yet"
            )
            raise NoSpaceError(
                errno.ENOSPC,
                f"no space left for step {step} in {self.root}: it needs {_mib(needed_bytes + SPACE_SLACK)} "
                f"(data and metadata) and the file system has {_mib(free)} free; nothing was written and the "
                f"{kept} (free space, or keep fewer steps)",
            )
        temp.mkdir(mode=DIRECTORY_MODE)
        if self.striping is not None:
            set_stripe(temp, self.striping)
        for name in spare:
            os.replace(recycle / name, temp / name)
            point("prepare.recycle")
        self._recycled = set(spare)
        return temp

    def commit(self, manifest: Manifest, durable_sizes: Mapping[str, int]) -> Path:
        """Make ``manifest.step`` visible: manifest last, fsync, rename into place.

        ``durable_sizes`` are the sizes of the step's regular files after every writer
        made them durable (:func:`merge_sizes` of every rank's :func:`sync_files`); they
        are recorded as committed, and the checksums of the files named in
        ``manifest.file_checksums``. Directories among ``manifest.files`` are fsync'd
        here. A committed step of the same number (saved again after a fallback) is
        exchanged with the new one atomically: one of them is committed at every moment.
        """
        step = manifest.step
        temp = self.temp_path(step)
        for stray in self._recycled - set(manifest.files):  # recycled, but not reused by the backend
            _remove(temp / stray)
        self._recycled = set()
        self._references[step] = frozenset(referenced_steps(manifest))
        sizes: dict[str, int | None] = {}
        for name in manifest.files:
            _not_world_writable(temp / name)
            if (temp / name).is_dir():
                _fsync_path(temp / name)
                sizes[name] = None
            elif name in durable_sizes:
                sizes[name] = durable_sizes[name]
            else:
                raise RuntimeError(f"commit of step {step}: no writer made {temp / name} durable")
        checksums: dict[str, str | None] = {
            name: file_checksum(temp / name) for name in manifest.file_checksums
        }
        manifest = replace(manifest, files=sizes, file_checksums=checksums)
        point("commit.manifest")
        write_durably(temp / MANIFEST_NAME, manifest.to_json())
        point("commit.fsync")
        _fsync_path(temp)
        final = self.root / step_name(step)
        point("commit.rename")
        replace_directory(temp, final, fault_points="commit")
        return final

    def references(self, step: int) -> frozenset[int]:
        """The steps whose files committed step ``step`` reads blocks from (cached; a
        sharded manifest lists them, its shards are not read).

        An unreadable manifest refers to nothing: that step cannot be restored anyway.
        """
        if step not in self._references:
            try:
                header = self.manifest(step, wanted=lambda _shard: False)
                self._references[step] = frozenset(referenced_steps(header))
            except CorruptCheckpointError:
                return frozenset()
        return self._references[step]

    def forget(self, step: int) -> None:
        """Drop what is cached about ``step`` (deleted by retention)."""
        self._references.pop(step, None)

    def readers_of(self, step: int) -> list[int]:
        """Committed steps that read blocks of step ``step``."""
        return [other for other in self.committed_steps() if other != step and step in self.references(other)]

    def manifest(self, step: int, wanted: Callable[[Shard], bool] | None = None) -> Manifest:
        """The parsed manifest of committed step ``step``, with the blocks of its shards
        (those ``wanted``, or all: :meth:`Manifest.from_json`); CorruptCheckpointError if
        unusable.
        """
        path = self.manifest_path(step)
        try:
            text = self.read_manifest(step)
        except (OSError, UnicodeDecodeError) as exc:
            raise CorruptCheckpointError(f"{path}: cannot read the manifest: {exc}") from exc
        return Manifest.from_json(text, str(path), self.shard_reader(step), wanted)

    def shard_reader(self, step: int) -> Callable[[str], str]:
        """What reads a file of committed step ``step``'s sharded manifest, by name."""
        return lambda name: (self.step_path(step) / name).read_text(encoding="utf-8")

    def read_manifest(self, step: int) -> str:
        """The text of committed step ``step``'s manifest."""
        return self.manifest_path(step).read_text(encoding="utf-8")
