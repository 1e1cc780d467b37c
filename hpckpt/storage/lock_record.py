"""The record in a run directory's lock file: who holds the lock, and whether it is alive.

One JSON line (see :class:`Record`), written whole at offset 0 and flushed to the storage
so that other nodes' clients see it; read back on a fresh descriptor every time, since
another node may have rewritten it. A record of the older text form (``host H pid P slurm
job J since S``) is read as a holder that held ``flock`` (whose liveness this machine
cannot prove: it has no boot id or PID namespace); anything else unreadable is an
unknown holder. Nothing here is collective.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import re
import socket
import time
import uuid
from pathlib import Path

_TOKEN = re.compile(r"[0-9a-f]{32}")
_TEXT_RECORD = re.compile(r"host (\S+) pid (\d+) slurm job (\S+) since (.+)")
_STATES = ("held", "released")


@dataclasses.dataclass
class Record:
    """Who holds a run directory's lock.

    Attributes
    ----------
    holder
        A random token (uuid4 hex) of this holding; "" for a record of the text form.
    host, boot, pidns, pid, start
        The holding process: host name, the kernel's boot id, the inode of its PID
        namespace, its PID and its start time (clock ticks after boot), which together
        name one process even where host names and PIDs recur.
    slurm_job, since
        The Slurm job id (None outside Slurm) and when the lock was taken (local time).
    flock
        Whether the holder holds ``flock`` on the lock file. Informative only: ``flock``
        is node-local on some file systems, so a granted one proves nothing about a
        holder on another node.
    state
        ``"held"``, or ``"released"`` once the holder let go.
    renewals
        How many times the holder has renewed the lease (a live holder increments it).
    lease_s
        The holder's lease in seconds (None when unknown): it renews four times per lease.
    """

    holder: str
    host: str
    boot: str | None
    pidns: int | None
    pid: int
    start: int | None
    slurm_job: str | None
    since: str
    flock: bool
    state: str
    renewals: int
    lease_s: float | None


_TYPES: dict[str, tuple[type, ...]] = {
    "holder": (str,), "host": (str,), "boot": (str, type(None)), "pidns": (int, type(None)),
    "pid": (int,), "start": (int, type(None)), "slurm_job": (str, type(None)), "since": (str,),
    "flock": (bool,), "state": (str,), "renewals": (int,), "lease_s": (int, float),
}


@functools.cache
def _machine() -> tuple[str, str | None, int | None]:
    """The host name, boot id and PID namespace of this process (None where the system has none)."""
    try:
        boot: str | None = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = None
    try:
        pidns: int | None = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        pidns = None
    return socket.gethostname(), boot, pidns


def start_time(pid: int | str) -> int | None:
    """The start time of process ``pid`` (``/proc/PID/stat``'s field 22), None when there is
    none or it has exited (a zombie not yet reaped: its files, and so its flock, are closed).
    """
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses
    return None if fields[0] in ("Z", "X", "x") else int(fields[19])


def new_record(lease_s: float, flock: bool) -> Record:
    """The record of this process taking the lock now."""
    host, boot, pidns = _machine()
    return Record(
        holder=uuid.uuid4().hex, host=host, boot=boot, pidns=pidns, pid=os.getpid(),
        start=start_time("self"), slurm_job=os.environ.get("SLURM_JOB_ID") or None,
        since=time.strftime("%Y-%m-%d %H:%M:%S"), flock=flock, state="held", renewals=0, lease_s=lease_s,
    )


def parse(raw: bytes) -> Record | None:
    """The record in the lock file's bytes ``raw``; None when empty or unreadable (an unknown holder)."""
    line = raw.split(b"\n", 1)[0].decode(errors="replace").strip()  # a longer record's tail may follow
    text = _TEXT_RECORD.fullmatch(line)
    if text:
        host, pid, job, since = text.groups()
        job_id = None if job == "-" else job
        return Record("", host, None, None, int(pid), None, job_id, since, True, "held", 0, None)
    try:
        fields = json.loads(line)
    except ValueError:
        return None
    if not isinstance(fields, dict) or any(not isinstance(fields.get(key, ...), kinds)
                                           for key, kinds in _TYPES.items()):
        return None
    record = Record(**{key: fields[key] for key in _TYPES})
    valid = (_TOKEN.fullmatch(record.holder) and record.state in _STATES
             and record.lease_s is not None and 0 < record.lease_s < math.inf)
    return record if valid else None


def encode(record: Record) -> bytes:
    """The lock file's bytes for ``record``: one JSON line."""
    return json.dumps(dataclasses.asdict(record)).encode() + b"\n"


def read_raw(path: Path) -> bytes:
    """The lock file's bytes, read through the file system on a fresh descriptor (b"" when absent)."""
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return b""
    try:
        return os.pread(descriptor, 65536, 0)
    finally:
        os.close(descriptor)


def write(descriptor: int, record: Record) -> None:
    """Replace the lock file's record with ``record`` and flush it to the storage."""
    data = encode(record)
    os.pwrite(descriptor, data, 0)
    os.ftruncate(descriptor, len(data))
    os.fsync(descriptor)  # other nodes' clients see only what was flushed


def identity(raw: bytes) -> str:
    """A name for the holding ``raw`` records: its token, or a digest of an unknown record."""
    record = parse(raw)
    return record.holder if record is not None and record.holder else hashlib.sha256(raw).hexdigest()[:32]


def describe(raw: bytes) -> str:
    """The holder ``raw`` records, as error messages and warnings name it."""
    record = parse(raw)
    if record is None:
        return "an unknown process"
    return f"host {record.host} pid {record.pid} slurm job {record.slurm_job or '-'} since {record.since}"


def alive_here(record: Record | None) -> bool | None:
    """Whether the holder is a live process of this machine: True or False where that can be
    proven (same host, boot and PID namespace, and a process with its PID and start time or
    none), None where it cannot (another machine, a container, an unknown holder).
    """
    if record is None or record.start is None or record.boot is None or record.pidns is None:
        return None
    if (record.host, record.boot, record.pidns) != _machine():
        return None
    return start_time(record.pid) == record.start
