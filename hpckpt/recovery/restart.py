"""Restore the newest committed step that verifies, falling back to older ones.

Phases (each agreed by :func:`hpckpt._comm.run_phase`):

1. ``list``: rank 0 lists the committed steps; everyone gets the list.
2. ``match``: each rank flattens its tree; per step, rank 0 reads the manifest and
   every rank compares its tree with it. Differences from every rank are merged
   into one :class:`~hpckpt.errors.StateMismatchError`, raised on every rank.
3. ``read``: each rank reads its blocks independently and checks their checksums.
   If any block of a step fails, every rank warns and tries the next older step.
4. Plain values are put into the tree only once a step has verified everywhere.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .._comm import gather_phase, run_phase
from ..buffers.host import writable_target
from ..checksum import ALGORITHM, block_checksum
from ..errors import CheckpointFallbackWarning, CorruptCheckpointError, StateMismatchError
from ..model.leaves import ARRAY_LEAF_TYPES
from ..model.manifest import Manifest
from ..model.tree import Slot, flatten
from ..storage.base import Backend, ReadRequest
from ..storage.commit import RunDirectory
from ..testing import faults

if TYPE_CHECKING:
    from mpi4py import MPI


@dataclass(frozen=True)
class _Target:
    """An array leaf to fill: the request to read and where its data ends up."""

    slot: Slot
    request: ReadRequest
    destination: np.ndarray


def list_committed_steps(comm: MPI.Comm, run_dir: RunDirectory) -> list[int]:
    """Committed steps, oldest first, as rank 0 sees them. Collective over ``comm``."""
    return gather_phase(comm, "list steps", lambda: run_dir.committed_steps() if comm.rank == 0 else None)[0]


def restore_newest(comm: MPI.Comm, run_dir: RunDirectory, backend: Backend, state: Any) -> int | None:
    """Fill ``state`` from the newest committed step that verifies; return its step.

    Collective over ``comm``: all ranks must call with trees of the same structure.
    Returns None when the run directory has no committed step.

    Raises
    ------
    StateMismatchError
        On every rank, when the tree differs from the newest readable step.
    CorruptCheckpointError
        On every rank, when no committed step verifies (arrays in ``state`` may then
        hold partial data).
    """
    steps = list_committed_steps(comm, run_dir)
    if not steps:
        return None
    slots = run_phase(comm, "restore: flatten", lambda: flatten(state))
    problems: list[str] = []
    for step in reversed(steps):
        source = str(run_dir.manifest_path(step))
        text = gather_phase(comm, f"restore step {step}: manifest", lambda: _read_text(run_dir, step, comm.rank))[0]
        try:
            if not isinstance(text, str):
                raise text
            manifest = Manifest.from_json(text, source)
        except CorruptCheckpointError as exc:
            problems.append(f"step {step}: {exc}")
            _warn_fallback(step, [str(exc)], steps)
            continue
        differences = gather_phase(
            comm, f"restore step {step}: match", lambda: _differences(manifest, slots, comm.size, comm.rank)
        )
        _raise_on_differences(step, source, differences)
        targets = run_phase(comm, f"restore step {step}: plan", lambda: _targets(manifest, slots, comm.rank))
        corrupt = gather_phase(
            comm, f"restore step {step}: read", lambda: _read_and_verify(backend, run_dir, step, targets, comm.rank)
        )
        findings = [finding for rank_findings in corrupt for finding in rank_findings]
        if findings:
            problems.append(f"step {step}: {findings[0]}")
            _warn_fallback(step, findings, steps)
            continue
        for target in targets:
            if target.destination is not target.request.out:
                target.destination[...] = target.request.out
        for slot in slots:
            if slot.path in manifest.values:
                slot.replace(manifest.values[slot.path])
        return step
    raise CorruptCheckpointError(
        f"no committed step in {run_dir.root} could be restored (arrays in the state may hold partial data): "
        + "; ".join(problems)
    )


def _read_text(run_dir: RunDirectory, step: int, rank: int) -> str | CorruptCheckpointError | None:
    if rank != 0:
        return None
    try:
        return run_dir.read_manifest(step)
    except (OSError, UnicodeDecodeError) as exc:
        return CorruptCheckpointError(f"{run_dir.manifest_path(step)}: cannot read the manifest: {exc}")


def _warn_fallback(step: int, findings: list[str], steps: list[int]) -> None:
    older = [s for s in steps if s < step]
    then = f"falling back to step {older[-1]}" if older else "no older committed step is left"
    shown = "; ".join(findings[:5]) + (f"; and {len(findings) - 5} more" if len(findings) > 5 else "")
    warnings.warn(f"checkpoint step {step} is corrupt ({shown}); {then}", CheckpointFallbackWarning, stacklevel=4)


def _differences(manifest: Manifest, slots: list[Slot], size: int, rank: int) -> list[str]:
    """What differs between this rank's tree and ``manifest`` (empty when they match)."""
    if manifest.world_size != size:
        return [
            f"written by {manifest.world_size} ranks but restored on {size}; "
            "restoring onto a different number of ranks is not supported by this version"
        ]
    stored = {record.path: record for record in manifest.leaves}
    found: list[str] = []
    for slot in slots:
        leaf = slot.value
        if not isinstance(leaf, ARRAY_LEAF_TYPES):
            if slot.path not in manifest.values:
                kind = stored[slot.path].kind if slot.path in stored else None
                found.append(
                    f"plain value {slot.path!r} is a {kind} array in the checkpoint"
                    if kind
                    else f"plain value {slot.path!r} is not in the checkpoint"
                )
            continue
        record = stored.get(slot.path)
        if record is None:
            found.append(f"{leaf.kind} leaf {slot.path!r} is not in the checkpoint")
            continue
        if record.kind != leaf.kind:
            found.append(f"leaf {slot.path!r} is {leaf.kind} in the state but {record.kind} in the checkpoint")
            continue
        dtype = np.dtype(getattr(leaf.array, "dtype", None))
        if dtype != np.dtype(record.dtype):
            found.append(f"leaf {slot.path!r} has dtype {dtype} but the checkpoint has {np.dtype(record.dtype)}")
        block = record.block_of(rank)
        if leaf.kind == "distributed":
            if leaf.global_shape != record.global_shape:
                found.append(
                    f"leaf {slot.path!r} has global_shape {leaf.global_shape} "
                    f"but the checkpoint has {record.global_shape}"
                )
            elif (leaf.offset, leaf.shape) != (block.offset, block.shape):
                found.append(
                    f"leaf {slot.path!r}: rank {rank}'s box is offset {leaf.offset} shape {leaf.shape} "
                    f"but the checkpoint's is offset {block.offset} shape {block.shape}"
                )
        elif leaf.shape != block.shape:
            found.append(f"leaf {slot.path!r} on rank {rank} has shape {leaf.shape} but the checkpoint has {block.shape}")
    paths = {slot.path for slot in slots}
    found += [f"{r.kind} leaf {r.path!r} is in the checkpoint but not in the state" for r in manifest.leaves if r.path not in paths]
    found += [f"plain value {p!r} is in the checkpoint but not in the state" for p in manifest.values if p not in paths]
    return found


def _raise_on_differences(step: int, source: str, differences: list[list[str]]) -> None:
    merged: list[str] = []
    for rank_differences in differences:
        merged += [d for d in rank_differences if d not in merged]
    if merged:
        raise StateMismatchError(
            f"the state does not match checkpoint step {step} ({source}):\n  " + "\n  ".join(merged)
        )


def _targets(manifest: Manifest, slots: list[Slot], rank: int) -> list[_Target]:
    stored = {record.path: record for record in manifest.leaves}
    targets = []
    for slot in slots:
        if not isinstance(slot.value, ARRAY_LEAF_TYPES):
            continue
        record = stored[slot.path]
        destination = writable_target(slot.value.array, slot.path)
        direct = destination.flags.c_contiguous
        out = destination if direct else np.empty(destination.shape, dtype=record.dtype)
        offset = record.block_of(rank).offset if record.kind == "distributed" else (0,) * out.ndim
        targets.append(_Target(slot, ReadRequest(record, rank, offset, out), destination))
    return targets


def _read_and_verify(backend: Backend, run_dir: RunDirectory, step: int, targets: list[_Target], rank: int) -> list[str]:
    """Read this rank's blocks; describe each block that fails verification."""
    faults.point("restore.read", rank)
    directory = run_dir.step_path(step)
    try:
        backend.read(directory, [target.request for target in targets])
    except (OSError, KeyError, ValueError) as exc:
        return [f"rank {rank} cannot read {directory}: {type(exc).__name__}: {exc}"]
    findings = []
    for target in targets:
        record = target.request.record
        expected = record.block_of(rank).checksum
        actual = block_checksum(target.request.out)
        if actual != expected:
            findings.append(
                f"leaf {record.path!r}, block of rank {rank}: {ALGORITHM} checksum {actual} != stored {expected}"
            )
    return findings
