"""How a save's planning and agreement, and a restore's planning, grow with the ranks.

    .venv/bin/python perf/bench_scale.py                 # 1k .. 100k ranks (make bench)
    .venv/bin/python perf/bench_scale.py --quick         # 2k and 8k ranks, checked (make test)

No MPI: the real planning code runs in one process on the synthetic plans of every
rank of a job (``--leaves`` per rank: half distributed row blocks of a 1-D split, half
small replicated arrays, as a training or solver state has), and the collectives are
modelled as the bytes and messages each rank receives (``MODEL`` below). Each rank
count runs in a child process, so its peak memory is its own. What is timed:

- ``first save`` (of a layout): rank 0 receives every plan (their pickled bytes), runs
  ``merge_plans``, every backend's ``layout`` and cuts each rank's part
  (``Backend.parts``); another rank receives its part and keeps it for later saves;
- ``groups``, the first save merged in the arrival groups instead (from 1024 ranks
  on): the first group's leader receives its group's plans, runs ``merge_group``, lays
  its group out and cuts its ranks' parts (every backend; posix also with files of 48
  ranks); rank 0 receives every leader's summary and extent, runs ``check_groups`` and
  ``group_starts``, lays out the records without blocks and creates hdf5's ``data.h5``;
  and an incremental save in groups: rank 0 sends each leader the base step's manifest
  without blocks, the first leader reads its shard of the base, compares, lays out the
  changed blocks and sends rank 0 what its group writes;
- ``later save``, on every rank but 0: ``plan_digests`` of its own plan and the one
  reduction of :func:`~hpckpt.protocols.save.agreement.agree_on_layout`;
- ``rank 0``, every save: the sync reports it gathers, ``fill_checksums`` and the
  manifest's JSON;
- ``restore``: rank 0 parses the manifest and cuts each rank's part of it (the blocks
  that rank reads); every other rank receives its part and plans its reads from it;
- ``boxes``: ``check_tiling`` of one leaf over 1-D, 2-D and 3-D grids and a 3-D
  recursive bisection of that many ranks, every rank count in one child process, timed
  in turn (the fastest of 15 rounds), so that the growth checked is a ratio measured
  in the same spell of this shared machine.

It prints a table per part with its growth exponent from the first rank count to the
last and between neighbouring ones (0: constant, 1: linear, 2: quadratic) and, without
``--quick``, writes ``OUT/scale.json`` and ``OUT/scale.png``. The first save merged in
groups is measured again alone with ``--group-leaves`` (100) leaves per rank, the
issue's budget. It fails (exit 1) if the box checks grow faster than ranks^1.5 from
the first rank count to the last; if the first save in groups misses that budget at
the largest rank count (10 MB to any rank; without ``--quick`` also 1 s of planning) or
its leaders' or rank 0's bytes grow faster than ranks^0.75; or if, in the real MPI
runs (unsharded, and sharded from 2 ranks on), a save of an unchanged layout gathers
the plans, a first save does not (or not in groups when sharded), or the bytes a save
or a restore brings the other ranks (not 0, nor a leader when sharded) grow with the
rank count by more than the width of the numbers they carry allows (1 % per doubling);
they may shrink, as a rank of the first arrival group writes fewer of the small
replicated leaves when the group grows.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import pickle
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from hpckpt._comm import arrival_group
from hpckpt._gc import collection_paused
from hpckpt.checksum import ALGORITHM, text_checksum
from hpckpt.model.boxes import check_tiling
from hpckpt.model.delta import (
    Delta,
    GroupWrites,
    all_group_writes,
    compose,
    group_writes,
    plan_delta,
    to_write,
)
from hpckpt.model.group_merge import check_groups, merge_group
from hpckpt.model.layout import AgreedLayout, fill_checksums, merge_plans, records_by_rank
from hpckpt.model.manifest import Block, LeafRecord, Manifest, Shard, shard_bounds, shard_json
from hpckpt.model.plans import LeafPlan, RankPlan, pack_plan, plan_digests, writer_chunk
from hpckpt.model.reads import BlockIndex, ReadRequest, manifest_part, shards_for
from hpckpt.protocols.save.committing import own_report
from hpckpt.protocols.save.request import SHARD_RANKS_ENV
from hpckpt.storage.base import BlockData
from hpckpt.storage.bp5 import ADIOS2Backend
from hpckpt.storage.commit import merge_sizes
from hpckpt.storage.hdf5 import HDF5Backend
from hpckpt.storage.names import shard_name
from hpckpt.storage.posix import PosixBackend

ROWS = 8  # rows of each distributed leaf per rank
MODEL = """\
collectives, per rank (P ranks, tree or recursive-doubling algorithms):
  every phase      allreduce of 1 integer: 2 log2(P) messages of 8 B; the watchdog's arrival
                   notices: each rank sends its group's leader one byte (groups of ceil(sqrt P)
                   ranks), each leader sends rank 0 one: at most 2 sqrt(P) received by any rank
  first save       gather of the plans to rank 0 (rank 0 receives P), then a scatter (none
                   where every rank planned alike, as ranks holding one replicated model do):
                   rank 0 sends each rank its part of the layout, P - 1 messages; from 1024
                   ranks on (all but shared posix files) to each group's leader
                   instead, which merges its sqrt(P) plans and sends rank 0 a summary (corner
                   weights, bytes, Local block counts: rank 0 receives sqrt(P)); rank 0
                   broadcasts to the leaders where each group's Local blocks start, and each
                   leader sends each of its ranks its part; an incremental save: rank 0
                   first broadcasts the base's manifest without blocks to the leaders (each
                   reads its shard of the base), and each summary says what its group writes
  later save       allreduce of 11 integers: 2 log2(P) messages of 88 B (and the watchdog's notices)
  sync             gather to rank 0: rank 0 receives P reports, the others send one; from
                   1024 ranks on (a sharded manifest) to each group's leader instead, which
                   receives sqrt(P) reports, writes their blocks into a shard and sends rank 0
                   its files' sizes and the shard's name: rank 0 receives sqrt(P) of those
  retain, steps    broadcast from rank 0: log2(P) messages
  restore          gather of the ranks' read requests to rank 0 (rank 0 receives P), then a
                   scatter: rank 0 sends each rank its part of the manifest, P - 1 messages"""


def replica_checksum(path: str) -> str:
    """The checksum of synthetic replicated leaf ``path`` (``weights/N``), one chunk alike on
    every rank: ``N`` in 16 hex digits."""
    return f"{int(path.rsplit('/', 1)[1]):016x}"


def synthetic_plans(ranks: int, leaves: int, packed: bool = False) -> list[RankPlan]:
    """Every rank's plan: ``leaves // 2`` distributed row blocks and as many replicated
    arrays; with ``packed``, the last leaf is the rank's pack of small Local leaves (an
    RNG state of 4 to 6 words: blocks of different sizes)."""
    rng = np.random.default_rng(ranks)
    plans = []
    arrays = leaves - 1 if packed else leaves
    for rank in range(ranks):
        own = []
        if packed:
            words = 4 + rank % 3
            own.append(pack_plan([("rng", "<u8", (words,), None)], 8 * words, f"{rank:016x}", None, None))
        for leaf in range(arrays // 2):
            checksum = f"{int(rng.integers(1 << 62)):016x}"
            own.append(LeafPlan(f"field/{leaf}", "distributed", "<f8", (ROWS, 16), (rank * ROWS, 0),
                                (ranks * ROWS, 16), checksum))
        for leaf in range(arrays - arrays // 2):
            shared = replica_checksum(f"weights/{leaf}")
            chunk = ((0,), (16,)) if writer_chunk(f"weights/{leaf}", rank, ranks) == 0 else None
            own.append(LeafPlan(f"weights/{leaf}", "replicated", "<f4", (16,), chunk[0] if chunk else (),
                                None, shared if chunk else ""))
        plans.append(RankPlan(tuple(own), {"iteration": 10, "name": "run"}))
    return plans


def seconds(action: Callable[[], Any]) -> tuple[float, Any]:
    """How long ``action`` took, and what it returned."""
    start = time.perf_counter()
    result = action()
    return time.perf_counter() - start, result


def grid_boxes(
    ranks: int, ndim: int
) -> tuple[tuple[int, ...], dict[int, tuple[tuple[int, ...], tuple[int, ...]]]]:
    """A tensor-product decomposition of about ``ranks`` cells in ``ndim`` dimensions."""
    side = round(ranks ** (1 / ndim))
    parts = [side] * (ndim - 1) + [max(1, ranks // side ** (ndim - 1))]
    cells = itertools.product(*(range(count) for count in parts))
    boxes = {rank: (tuple(4 * i for i in cell), (4,) * ndim) for rank, cell in enumerate(cells)}
    return tuple(4 * count for count in parts), boxes


def bisection_boxes(
    ranks: int,
) -> tuple[tuple[int, ...], dict[int, tuple[tuple[int, ...], tuple[int, ...]]]]:
    """A 3-D orthogonal recursive bisection into ``ranks`` boxes (uneven cuts, axes in turn)."""
    rng = np.random.default_rng(0)
    shape = (1 << 20,) * 3
    boxes = [((0, 0, 0), shape)]
    level = 0
    while len(boxes) < ranks:
        # the last level splits only as many as needed
        axis, halves, splits = level % 3, [], ranks - len(boxes)
        for number, (offset, extent) in enumerate(boxes):
            if number >= splits:
                halves.append((offset, extent))
                continue
            cut = int(extent[axis] * rng.uniform(0.3, 0.7))
            low = tuple(cut if a == axis else n for a, n in enumerate(extent))
            high = tuple(n - cut if a == axis else n for a, n in enumerate(extent))
            moved = tuple(o + cut if a == axis else o for a, o in enumerate(offset))
            halves += [(offset, low), (moved, high)]
        boxes, level = halves, level + 1
    return shape, dict(enumerate(boxes))


# as in the library's save and restore: else full collections walk every record made so far
@collection_paused()
def measure(ranks: int, leaves: int) -> dict[str, Any]:
    """Every part at ``ranks`` ranks (run in a child process: its peak memory is this one's)."""
    plans = synthetic_plans(ranks, leaves)
    found: dict[str, Any] = {"ranks": ranks, "leaves": leaves}
    found["first_bytes"] = len(pickle.dumps(plans, protocol=pickle.HIGHEST_PROTOCOL))
    found["merge_s"], (records, values) = seconds(lambda: merge_plans(plans))
    for backend in (PosixBackend(), HDF5Backend(), ADIOS2Backend()):
        found[f"layout_{backend.name}_s"], placed = seconds(
            lambda backend=backend: backend.layout(records))
    placed = PosixBackend().layout(records)
    found["parts_s"], parts = seconds(lambda: PosixBackend().parts(placed, range(ranks)))
    found["part_bytes"] = len(pickle.dumps(parts[1], protocol=pickle.HIGHEST_PROTOCOL))
    found["keep_s"] = seconds(
        lambda: AgreedLayout.of(1, plan_digests(plans[1])[1], 1, ranks, parts[1], 0))[0]
    kept = AgreedLayout.of(1, plan_digests(plans[0])[1], 0, ranks, placed, 0)  # rank 0's: every record
    found["later_s"] = min(seconds(lambda: plan_digests(plans[1]))[0] for _ in range(20))
    found["later_bytes"] = 11 * 8
    reports = [
        (
            {f"data-{rank:05d}.bin": 1 << 20},
            {leaf.path: leaf.checksum for leaf in plan.leaves if leaf.kind == "distributed"},
        )
        for rank, plan in enumerate(plans)
    ]
    found["sync_bytes"] = len(pickle.dumps(reports, protocol=pickle.HIGHEST_PROTOCOL))
    chunks = {leaf.path: (replica_checksum(leaf.path),) for leaf in plans[0].leaves
              if leaf.kind == "replicated"}

    # posix: a file per rank
    files: dict[str, int | None] = {f"data-{rank:05d}.bin": 1 << 20 for rank in range(ranks)}

    def manifest_text() -> str:
        filled = fill_checksums(kept.records, [sums for _, sums in reports], chunks)
        return Manifest(ranks, "coordinated", "posix", ranks, "xxh3_64", filled, values, 0.0, 0.0,
                        files=files).to_json()

    found["manifest_s"], text = seconds(manifest_text)
    found["manifest_bytes"] = len(text)
    requests = [
        ReadRequest(rank, {leaf.path: (leaf.offset, leaf.shape)
                           for leaf in plan.leaves if leaf.kind == "distributed"})
        for rank, plan in enumerate(plans)
    ]

    def cut_parts() -> list[Manifest]:
        whole, index = Manifest.from_json(text, "bench"), BlockIndex()
        return [manifest_part(whole, request, index) for request in requests]

    found["restore_root_s"], manifest_parts = seconds(cut_parts)
    found["restore_bytes"] = len(pickle.dumps(manifest_parts[1], protocol=pickle.HIGHEST_PROTOCOL))
    found["restore_s"] = seconds(lambda: manifest_parts[1].tree_leaves)[0]
    found.update(sharded(ranks, kept.records, reports, chunks, values, requests))
    found.update(in_groups(ranks, plans))
    found["peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return found


BOX_SHAPES = ("1d", "2d", "3d", "bisection")


@collection_paused()
def box_checks(rank_counts: list[int], rounds: int = 15) -> dict[int, dict[str, float]]:
    """``check_tiling`` of one leaf over each decomposition (``BOX_SHAPES``) at each rank
    count: the fastest of ``rounds``, with the rank counts timed in turn within each
    round, so that a slow spell of a shared machine slows every count alike instead of
    one count's child process."""
    cases = {(count, name): case for count in rank_counts for name, case in
             zip(BOX_SHAPES, (grid_boxes(count, 1), grid_boxes(count, 2), grid_boxes(count, 3),
                              bisection_boxes(count)))}
    best = dict.fromkeys(cases, math.inf)
    for _ in range(rounds):
        for key, (shape, boxes) in cases.items():
            best[key] = min(best[key], seconds(lambda: check_tiling("u", shape, boxes))[0])
    return {count: {f"boxes_{name}_s": best[count, name] for name in BOX_SHAPES} for count in rank_counts}


@collection_paused()
def measure_groups(ranks: int, leaves: int) -> dict[str, Any]:
    """The first save merged in groups alone (:func:`in_groups`), at ``ranks`` ranks of
    ``leaves`` leaves: a merge of every plan on rank 0 at 100 leaves x 100k ranks would
    need about 20 GB here."""
    found = {"ranks": ranks, "leaves": leaves,
             **in_groups(ranks, synthetic_plans(ranks, leaves, packed=True))}
    found["peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return found


SHARED_FILE_RANKS = 48  # posix files of a node's ranks, which do not divide the groups' sqrt(P)


def in_groups(ranks: int, plans: list[RankPlan]) -> dict[str, Any]:
    """A first save merged in the arrival groups (from 1024 ranks on): what the leader of
    the first group receives, merges and lays out (every backend's layout and parts,
    posix with a file per rank and per :data:`SHARED_FILE_RANKS` ranks), what rank 0
    receives from the leaders (their summaries and a backend's extents, the largest) and
    checks (``check_groups``, then the slowest backend's ``group_starts``), what each
    leader then receives from rank 0 (the largest starts), and hdf5's rank 0 creating
    ``data.h5`` with every dataset (the real write's, alone on ``COMM_SELF``)."""
    from mpi4py import MPI

    first = arrival_group(0, ranks)
    found: dict[str, Any] = {"group_plans_bytes": len(pickle.dumps(plans[first.start : first.stop],
                                                                    protocol=pickle.HIGHEST_PROTOCOL))}
    found["group_merge_s"], (records, _) = seconds(
        lambda: merge_group(plans[first.start : first.stop], first.start, ranks))
    hdf5 = HDF5Backend(direct_io=False)
    backends = {"adios2": ADIOS2Backend(), "hdf5": hdf5, "posix": PosixBackend(),
                "posix_shared": PosixBackend(ranks_per_file=SHARED_FILE_RANKS)}
    summaries, extents = [], {name: [] for name in backends}  # type: ignore[var-annotated]
    for leader in range(0, ranks, len(first)):
        group = arrival_group(leader, ranks)
        group_records, summary = merge_group(plans[group.start : group.stop], leader, ranks)
        summaries.append(summary)
        for name, backend in backends.items():
            extents[name].append(backend.group_extent(group_records, group))
    found["summaries_bytes"] = max(
        len(pickle.dumps(list(zip(summaries, extents[name])), protocol=pickle.HIGHEST_PROTOCOL))
        for name in backends
    )
    found["check_groups_s"], verdict = seconds(lambda: check_groups(summaries))
    assert verdict is not None
    starts, starts_bytes = {}, []
    for name, backend in backends.items():
        found[f"group_starts_{name}_s"], starts[name] = seconds(
            lambda b=backend, e=extents[name]: b.group_starts(e, verdict.headers))
        by_leader = dict(zip(range(0, ranks, len(first)), starts[name]))
        starts_bytes.append(len(pickle.dumps(by_leader, protocol=pickle.HIGHEST_PROTOCOL)))
    found["starts_bytes"] = max(starts_bytes)
    for name, backend in backends.items():
        found[f"group_layout_{name}_s"], parts = seconds(
            lambda backend=backend, start=starts[name][0]: backend.parts(
                backend.layout(records, start), first))
        found["group_part_bytes" if name != "posix_shared" else "group_part_shared_bytes"] = len(
            pickle.dumps(parts[1], protocol=pickle.HIGHEST_PROTOCOL))
    found["headers_layout_s"], headers = seconds(lambda: hdf5.layout(verdict.headers, starts["hdf5"][0]))
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as scratch:
        found["hdf5_create_s"] = seconds(
            lambda: hdf5.write(MPI.COMM_SELF, Path(scratch), headers, []))[0]
    found.update(
        incremental_in_groups(ranks, records, verdict.headers, backends["posix"], starts["posix"][0]))
    return found


def incremental_in_groups(ranks: int, records: tuple[LeafRecord, ...], headers: tuple[LeafRecord, ...],
                          backend: PosixBackend, start: Any) -> dict[str, Any]:
    """An incremental save merged in groups, whose base is a sharded step of the same
    layout in which one leaf changed on every rank: what rank 0 sends each leader (the
    base's manifest without blocks, its shards without bounds), what the first group's
    leader then does (reads its shard of the base, compares its group's merged
    ``records`` with it, lays out the changed blocks and cuts its ranks' parts) and
    sends rank 0, and rank 0's sum of every group's and its manifest's leaves."""
    first = arrival_group(0, ranks)
    leaders = range(0, ranks, len(first))
    stored = backend.layout(records, start)
    text = shard_json(1, first.start, first.stop, {record.path: list(record.blocks) for record in stored})
    shards = tuple(
        Shard(shard_name(leader), leader, arrival_group(leader, ranks).stop, text_checksum(text), {})
        for leader in leaders
    )
    base = Manifest(1, "coordinated", backend.name, ranks, ALGORITHM, backend.layout(headers), {}, 0.0, 0.0,
                    shards=shards)
    found: dict[str, Any] = {"delta_base_bytes": len(pickle.dumps(base, protocol=pickle.HIGHEST_PROTOCOL))}
    changed = (replace(records[0],
                       blocks=tuple(replace(block, checksum="changed") for block in records[0].blocks)),
               *records[1:])

    def compare() -> tuple[tuple[LeafRecord, ...], GroupWrites]:
        held = base.with_shard_blocks("bench", {shard_name(first.start): text}.__getitem__,
                                      lambda shard: shard.first < first.stop and first.start < shard.stop)
        delta = plan_delta(changed, held, backend.name, ALGORITHM)
        written = to_write(changed, delta)
        backend.group_extent(written, first)
        return written, group_writes(written, delta)

    found["delta_group_s"], (written, writes) = seconds(compare)
    assert writes.paths == {records[0].path} and writes.in_steps == {1}, writes
    found["delta_layout_s"] = seconds(lambda: backend.parts(backend.layout(written, start), first))[0]
    # one each
    found["delta_summaries_bytes"] = (
        len(pickle.dumps(writes, protocol=pickle.HIGHEST_PROTOCOL)) * len(leaders)
    )
    locations = {record.path: record.location for record in base.leaves}

    def add_up() -> tuple[LeafRecord, ...]:  # as MergeInGroups on rank 0, every leader's summary alike
        paths = all_group_writes([writes] * len(leaders)).paths
        placed = backend.layout([header for header in headers if header.path in paths])
        return compose(headers, placed, Delta(1, 0, {}, locations))

    found["delta_root_s"] = seconds(add_up)[0]
    return found


def sharded(ranks: int, records: tuple[LeafRecord, ...], reports: list[tuple[dict[str, int], dict[str, str]]],
            chunks: dict[str, tuple[str, ...]], values: dict[str, Any],
            requests: list[ReadRequest]) -> dict[str, Any]:
    """A sharded manifest (from 1024 ranks on): what the leader of the first group receives
    and writes in a save, what rank 0 receives and writes, and what the leader of a group
    in the middle reads and cuts in a restore on as many ranks."""
    # each rank's own blocks, as it holds them after the merge
    by_rank = records_by_rank(records, range(ranks))

    def report_of(rank: int) -> tuple[dict[str, int], dict[str, Block]]:
        blocks = [BlockData(record, record.blocks[0], np.empty(0))
                  for record in by_rank[rank] if record.blocks]
        return own_report(reports[rank], blocks, rank, chunks)

    def blocks_of(group: range) -> dict[str, list[Block]]:
        blocks: dict[str, list[Block]] = {}
        for rank in group:
            for path, block in report_of(rank)[1].items():
                blocks.setdefault(path, []).append(block)
        return blocks

    first, middle = arrival_group(0, ranks), arrival_group(ranks // 2, ranks)
    found: dict[str, Any] = {"shard_sync_bytes": len(pickle.dumps([report_of(rank) for rank in first],
                                                                   protocol=pickle.HIGHEST_PROTOCOL))}
    found["shard_s"], text = seconds(lambda: shard_json(ranks, first.start, first.stop, blocks_of(first)))
    found["shard_bytes"] = len(text)
    texts = {shard_name(group.start): shard_json(ranks, group.start, group.stop, blocks_of(group))
             for group in (first, middle)}
    from_leaders = []
    # the bounds as each leader finds them; checksums of the texts made
    for leader in range(0, ranks, len(first)):
        group = arrival_group(leader, ranks)
        placed: dict[str, list[Block]] = {}
        for rank in group:
            for record in by_rank[rank]:
                placed.setdefault(record.path, []).extend(record.blocks)
        bounds = shard_bounds(placed)
        checksum = text_checksum(texts[shard_name(leader)]) if shard_name(leader) in texts else "0" * 16
        from_leaders.append(({f"data-{rank:05d}.bin": 1 << 20 for rank in group},
                             Shard(shard_name(leader), leader, group.stop, checksum, bounds)))
    found["leaders_bytes"] = len(pickle.dumps(from_leaders, protocol=pickle.HIGHEST_PROTOCOL))

    def top() -> str:
        files = merge_sizes(sizes for sizes, _ in from_leaders)
        bare = tuple(replace(record, blocks=()) for record in records)
        return Manifest(ranks, "coordinated", "posix", ranks, "xxh3_64", bare, values, 0.0, 0.0,
                        files=dict(files), shards=tuple(entry for _, entry in from_leaders)).to_json()

    found["top_s"], top_text = seconds(top)
    found["top_bytes"] = len(top_text)
    asked = [requests[rank] for rank in middle]

    bare = Manifest.from_json(top_text, "bench", wanted=lambda _shard: False)  # as rank 0 reads it
    # what it sends each leader
    found["shard_top_bytes"] = len(pickle.dumps(bare, protocol=pickle.HIGHEST_PROTOCOL))

    def leader_restore() -> tuple[set[str], list[Manifest]]:
        needed = shards_for(bare, asked)
        read = bare.with_shard_blocks("bench", texts.__getitem__, lambda shard: shard.file in needed)
        index = BlockIndex()
        return needed, [manifest_part(read, request, index) for request in asked]

    found["shard_restore_s"], (needed, parts) = seconds(leader_restore)
    found["shard_restore_read"] = len(needed)
    # its own, and rank 0's replicated chunks
    assert needed == {shard_name(first.start), shard_name(middle.start)}, needed
    found["shard_restore_bytes"] = len(pickle.dumps(parts[1], protocol=pickle.HIGHEST_PROTOCOL))
    return found


class CountingComm:
    """A communicator that counts, per rank, the collective calls made on it (and on its
    duplicates) and the bytes each returned to this rank: pickled results of the
    lower-case calls, receive buffers of the upper-case ones (a non-blocking broadcast's
    when it is started). Point-to-point traffic
    (the watchdog's arrival notices) is not counted; the model states it."""

    COUNTED = ("allgather", "gather", "scatter", "bcast", "allreduce", "Allreduce", "Bcast", "Ibcast")

    def __init__(self, comm: Any, tally: list[tuple[str, int]]) -> None:
        self._comm, self._tally = comm, tally

    def Dup(self) -> CountingComm:  # noqa: N802 - mpi4py's name
        return CountingComm(self._comm.Dup(), self._tally)

    def Split(self, *args: Any) -> CountingComm:  # noqa: N802 - the arrival groups' communicators
        return CountingComm(self._comm.Split(*args), self._tally)

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._comm, name)
        if name not in self.COUNTED:
            return found

        def counted(*args: Any, **kwargs: Any) -> Any:
            result = found(*args, **kwargs)
            if name[0].isupper():
                buffer = args[1] if name == "Allreduce" else args[0]  # an array, or [array, datatype]
                received = np.asarray(buffer[0] if isinstance(buffer, (list, tuple)) else buffer).nbytes
            else:
                received = (0 if result is None
                            else len(pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)))
            self._tally.append((name, received))
            return result

        return counted


def count_collectives(out: Path) -> None:
    """Three posix saves of one layout under ``mpiexec``, then an incremental one over the
    third in which one leaf changed, and a restore: every rank's collective calls and
    bytes received per save, gathered to rank 0 into ``out`` (JSON)."""
    import shutil

    from mpi4py import MPI

    import hpckpt

    world = MPI.COMM_WORLD
    tally: list[tuple[str, int]] = []
    directory = out.parent / f"{out.stem}-run"
    if world.rank == 0:
        shutil.rmtree(directory, ignore_errors=True)
    world.Barrier()
    saves = []
    with hpckpt.Checkpointer(directory, comm=CountingComm(world, tally), backend="posix",
                             keep=1) as checkpointer:
        for step in (1, 2, 3, 4):
            rows = np.full((ROWS, 16), float(min(step, 3)))
            whole, offset = (world.size * ROWS, 16), (world.rank * ROWS, 0)
            state = {
                "field": {str(leaf): hpckpt.Distributed(rows, global_shape=whole, offset=offset)
                          for leaf in range(10)},
                "weights": {str(leaf): hpckpt.Replicated(np.full(16, float(leaf), dtype=np.float32))
                            for leaf in range(10)},
                "iteration": step,
            }
            if step == 4:  # incremental over step 3: one leaf changed
                state["field"]["0"] = hpckpt.Distributed(rows + 1.0, global_shape=whole, offset=offset)
            del tally[:]
            checkpointer.save(step, state, base=3 if step == 4 else None)
            saves.append({"calls": len(tally), "received": sum(nbytes for _, nbytes in tally),
                          "gathered": checkpointer.last_save.plans_gathered,
                          "grouped": checkpointer.last_save.merged_in_groups})
        del tally[:]
        checkpointer.restore(state)
        saves.append({"calls": len(tally), "received": sum(nbytes for _, nbytes in tally),
                      "gathered": False, "grouped": False})
    every = world.gather(saves, root=0)
    if world.rank == 0:
        out.write_text(json.dumps(every))
        shutil.rmtree(directory, ignore_errors=True)


def run_child(command: list[str], timeout: float, env: dict[str, str] | None = None) -> str:
    """The output of ``command``, run in a process group of its own that a timeout kills
    whole, ranks included (``tests/processes.py``); RuntimeError with its errors when it
    fails."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.processes import run_group

    run = run_group(command, timeout=timeout, env=env)
    if run.returncode:
        raise RuntimeError(f"{' '.join(command)} failed ({run.returncode}):\n{run.stderr[-3000:]}")
    return run.stdout


def check_model(
    sizes: list[int], mpiexec: str, scratch: Path, counted: dict[str, Any], sharded: bool
) -> list[str]:
    """Run :func:`count_collectives` at each of ``sizes`` ranks, ``sharded`` (from 2 ranks
    on: the first save merged in groups, the manifest sharded, the restore through the
    leaders) or not; print what each rank received per save and in the restore (and put
    it in ``counted``, by rank count); the model's claims that do not hold. "others" are
    the ranks but 0, and but the groups' leaders when ``sharded``."""
    failed = []
    what = "sharded from 2 ranks on" if sharded else "unsharded"
    print(f"real MPI, 20 leaves per rank, posix, {what}: collective calls and bytes received per rank")
    print(f"{'ranks':>6s}  {'call':>20s}  {'plans':>8s}  {'calls':>5s}  {'rank 0 (B)':>10s}  "
          f"{'leaders (B)':>11s}  {'others, most (B)':>16s}")
    calls = ("save 1", "save 2", "save 3", "save 4 (incremental)", "restore")
    most_of: dict[str, dict[int, int]] = {
        "a first save": {}, "a later save": {}, "an incremental save": {}, "a restore": {}
    }
    env = {**os.environ, SHARD_RANKS_ENV: "2" if sharded else ""}
    for size in sizes:
        out = scratch / f"scale-count-{size}.json"
        command = [mpiexec, "-n", str(size), sys.executable, __file__, "--count-into", str(out)]
        run_child(command, timeout=300, env=env)
        per_rank = json.loads(out.read_text())
        counted[f"{'sharded ' if sharded else ''}{size}"] = per_rank
        out.unlink()
        leaders = {arrival_group(rank, size).start for rank in range(size)} if sharded else {0}
        others = [rank for rank in range(size) if rank not in leaders]
        for number, call in enumerate(calls):
            counts = [rank_counts[number] for rank_counts in per_rank]
            most = max(counts[rank]["received"] for rank in others)
            led = max((counts[rank]["received"] for rank in leaders if rank), default=0)
            plans = "" if call == "restore" else "rank 0" if counts[0]["gathered"] else "reused"
            plans = "groups" if counts[0]["grouped"] else plans
            print(f"{size:6d}  {call:>20s}  {plans:>8s}  {counts[1]['calls']:5d}  "
                  f"{counts[0]['received']:10d}  {led:11d}  {most:16d}")
            merged = number in (0, 3)  # the first save and the incremental one merge the plans
            if call != "restore" and any((count["gathered"], count["grouped"]) != (merged, sharded and merged)
                                         for count in counts):
                failed.append(f"{size} ranks, {what}, {call}: plans merged {plans}")
            if number != 1:
                name = ("a first save", "", "a later save", "an incremental save", "a restore")[number]
                most_of[name][size] = most
    # A rank's part may grow with the width of the numbers in it (offsets, ranks: 1 % per
    # doubling of the ranks) and shrink when it writes fewer of the small replicated leaves
    # (the first ceil(sqrt(P)) ranks share them, writer_chunk); never grow with P itself.
    for call, most in most_of.items():
        fewest = min(most)
        allowed = {size: most[fewest] * (1 + 0.01 * math.log2(size / fewest)) + 1 for size in most}
        if any(count > allowed[size] for size, count in most.items()):
            failed.append(f"{what}: the bytes {call} brings the others grow with the ranks: {most}")
    return failed


def exponents(points: list[dict[str, Any]], key: str) -> list[float]:
    """The growth exponent of ``key`` between consecutive rank counts."""
    return [
        math.log(b[key] / a[key]) / math.log(b["ranks"] / a["ranks"])
        if a[key] > 0 and b[key] > 0 else float("nan")
        for a, b in itertools.pairwise(points)
    ]


PARTS = [  # (key, heading, unit)
    ("first_bytes", "first save: plans rank 0 receives", "MB"),
    ("merge_s", "first save: merge_plans on rank 0", "s"),
    ("layout_posix_s", "first save: posix layout on rank 0", "s"),
    ("layout_hdf5_s", "first save: hdf5 layout on rank 0", "s"),
    ("layout_adios2_s", "first save: adios2 layout on rank 0", "s"),
    ("parts_s", "first save: rank 0 cuts the parts (posix)", "s"),
    ("part_bytes", "first save: the part another rank receives", "MB"),
    ("keep_s", "first save: a rank keeps its part", "s"),
    ("group_plans_bytes", "groups: plans a leader receives", "MB"),
    ("group_merge_s", "groups: merge_group on a leader", "s"),
    ("group_layout_posix_s", "groups: a leader's posix layout and parts", "s"),
    ("group_layout_adios2_s", "groups: a leader's adios2 layout and parts", "s"),
    ("group_layout_hdf5_s", "groups: a leader's hdf5 layout and parts", "s"),
    ("group_layout_posix_shared_s", "groups: a leader's posix layout, shared files", "s"),
    ("summaries_bytes", "groups: summaries rank 0 receives", "MB"),
    ("check_groups_s", "groups: check_groups on rank 0", "s"),
    ("group_starts_adios2_s", "groups: adios2 group_starts on rank 0", "s"),
    ("group_starts_hdf5_s", "groups: hdf5 group_starts on rank 0", "s"),
    ("group_starts_posix_s", "groups: posix group_starts on rank 0", "s"),
    ("group_starts_posix_shared_s", "groups: posix group_starts, shared files", "s"),
    ("headers_layout_s", "groups: rank 0 lays out the records", "s"),
    ("starts_bytes", "groups: rank 0 sends each leader", "MB"),
    ("group_part_bytes", "groups: the part another rank receives", "MB"),
    ("group_part_shared_bytes", "groups: the part, posix shared files", "MB"),
    ("hdf5_create_s", "groups: hdf5's rank 0 creates data.h5", "s"),
    ("delta_base_bytes", "incremental: rank 0 sends each leader the base", "MB"),
    ("delta_group_s", "incremental: a leader reads its base shard, compares", "s"),
    ("delta_layout_s", "incremental: a leader lays out the changed blocks", "s"),
    ("delta_summaries_bytes", "incremental: what rank 0 receives besides", "MB"),
    ("delta_root_s", "incremental: rank 0 adds the groups up", "s"),
    ("later_s", "later save: planning on a rank (digests)", "s"),
    ("later_bytes", "later save: bytes a rank receives", "MB"),
    ("sync_bytes", "rank 0: sync reports received", "MB"),
    ("manifest_s", "rank 0: checksums and manifest JSON", "s"),
    ("manifest_bytes", "rank 0: manifest written", "MB"),
    ("shard_sync_bytes", "sharded: reports a leader receives", "MB"),
    ("shard_s", "sharded: a leader's shard JSON", "s"),
    ("shard_bytes", "sharded: a leader's shard written", "MB"),
    ("leaders_bytes", "sharded: rank 0 receives from leaders", "MB"),
    ("top_s", "sharded: rank 0's manifest JSON", "s"),
    ("top_bytes", "sharded: rank 0's manifest written", "MB"),
    ("shard_top_bytes", "sharded restore: rank 0 sends each leader", "MB"),
    ("shard_restore_s", "sharded restore: a leader reads and cuts", "s"),
    ("shard_restore_bytes", "sharded restore: the part a rank receives", "MB"),
    ("restore_root_s", "restore: rank 0 parses and cuts the parts", "s"),
    ("restore_bytes", "restore: the part a rank receives", "MB"),
    ("restore_s", "restore: a rank opens its part", "s"),
    ("boxes_1d_s", "boxes: 1-D slabs", "s"),
    ("boxes_2d_s", "boxes: 2-D grid", "s"),
    ("boxes_3d_s", "boxes: 3-D grid", "s"),
    ("boxes_bisection_s", "boxes: 3-D recursive bisection", "s"),
    ("peak_mib", "peak memory of the process", "MiB"),
]


# what each rank receives in a save merged in groups (an incremental one: the delta's too)
RECEIVED = {
    "a leader": ("group_plans_bytes", "starts_bytes", "delta_base_bytes"),
    "rank 0": ("group_plans_bytes", "summaries_bytes", "delta_summaries_bytes"),  # it leads the first group
    "another rank": ("group_part_bytes",),
    "another rank (posix shared files)": ("group_part_shared_bytes",),
}
LAID_OUT = ("adios2", "hdf5", "posix", "posix_shared")


def check_groups_goal(grouped: list[dict[str, Any]], timed: bool) -> list[str]:
    """Issue 22's budget for a save merged in groups, at the largest rank count: at most
    10 MB received by any rank (:data:`RECEIVED`, an incremental save's included) and
    (``timed``: not in ``--quick``, which ``make test`` runs) 1 s of planning on any rank
    (a leader's merge, comparison with the base and layout; rank 0's check, sums and its
    hdf5 file's creation besides); and the bytes a leader or rank 0 receives growing no
    faster than ranks^0.75 (sqrt(P) groups of sqrt(P) ranks: 0.5)."""
    last, failed = grouped[-1], []
    received = {who: sum(last[key] for key in keys) for who, keys in RECEIVED.items()}
    most = max(received.values())
    layout = max(last[f"group_layout_{name}_s"] for name in LAID_OUT)
    leader = last["group_merge_s"] + last["delta_group_s"] + layout
    starts = max(last[f"group_starts_{name}_s"] for name in LAID_OUT)
    root = leader + last["check_groups_s"] + starts + last["headers_layout_s"] + last["delta_root_s"]
    print(f"bench_scale: a save in groups at {last['ranks']:,d} ranks x {last['leaves']} leaves "
          f"(one a pack of Local leaves), incremental or not: any rank receives at most {most / 1e6:.2f} MB ("
          + ", ".join(f"{who} {count / 1e6:.2f}" for who, count in received.items())
          + f"); a leader plans for {leader:.3f} s, rank 0 for {root:.3f} s, "
          f"and hdf5's rank 0 creates data.h5 in {last['hdf5_create_s']:.3f} s")
    root += last["hdf5_create_s"]
    if most > 10e6 or (timed and root > 1.0):
        failed.append(f"a save in groups at {last['ranks']:,d} ranks misses 10 MB or 1 s")
    for key in ("group_plans_bytes", "summaries_bytes"):
        growth = exponents([grouped[0], last], key)[0]
        if growth > 0.75:
            failed.append(f"{key} grows as ranks^{growth:.2f}")
    return failed


def print_table(points: list[dict[str, Any]]) -> None:
    header = "".join(f"{point['ranks']:>11,d}" for point in points)
    print(f"{'':46s}" + header + "   exponents: overall, then per step")
    for key, heading, unit in [part for part in PARTS if part[0] in points[0]]:
        scale = 1e-6 if unit == "MB" else 1.0
        cells = "".join(f"{point[key] * scale:11.4g}" for point in points)
        growth = " ".join(f"{e:.2f}"
                          for e in exponents([points[0], points[-1]], key) + exponents(points, key))
        print(f"{heading + ' (' + unit + ')':46s}{cells}   {growth}")


def plot(points: list[dict[str, Any]], grouped: list[dict[str, Any]], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (times, sizes, groups) = plt.subplots(1, 3, figsize=(17, 4.5))
    ranks = [point["ranks"] for point in points]
    # one per group
    styles = {"first": "-", "groups": (0, (5, 1)), "later": "--", "rank": ":", "restore": "-.",
              "boxes": (0, (1, 3))}
    for key, heading, unit in [part for part in PARTS if part[0] in points[0]]:
        style = {"linestyle": styles.get(heading.split()[0].rstrip(":"), "-"), "marker": "o"}
        if unit == "s":
            times.loglog(ranks, [max(point[key], 1e-6) for point in points], label=heading, **style)
        elif unit == "MB":
            sizes.loglog(ranks, [max(point[key], 1) / 1e6 for point in points], label=heading, **style)
    times.axhline(1, color="grey", linestyle=":", label="1 s")
    times.set(xlabel="ranks", ylabel="seconds",
              title=f"time per rank ({points[0]['leaves']} leaves per rank)")
    sizes.set(xlabel="ranks", ylabel="MB", title="bytes received or written")
    sizes.axhline(10, color="grey", linestyle=":", label="10 MB")
    for key, heading, unit in PARTS:
        if key in grouped[0] and unit != "MiB":
            scale = 1e-6 if unit == "MB" else 1.0
            groups.loglog([point["ranks"] for point in grouped],
                          [max(point[key] * scale, 1e-6) for point in grouped],
                          label=f"{heading} ({unit})", marker="o", linestyle="-" if unit == "s" else "--")
    groups.axhline(1, color="grey", linestyle=":", label="1 s, 1 MB")
    groups.axhline(10, color="black", linestyle=":", label="10 MB")
    groups.set(xlabel="ranks", ylabel="seconds (solid) or MB (dashed)",
               title=f"first save merged in groups ({grouped[0]['leaves']} leaves per rank)")
    for axes in (times, sizes, groups):
        axes.legend(fontsize=6)
        axes.grid(True, which="both", alpha=0.3)
    figure.tight_layout()
    path = out / "scale.png"
    figure.savefig(path, dpi=110)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1000, 4000, 16000, 64000, 100000])
    parser.add_argument("--leaves", type=int, default=20, help="leaves per rank (default 20)")
    parser.add_argument("--quick", action="store_true", help="2k and 8k ranks; fail on super-linear growth")
    parser.add_argument("--out", default="perf/results",
                        help="where scale.json and scale.png go (not with --quick)")
    parser.add_argument("--mpi", type=int, nargs="*", default=None, help="rank counts of the real MPI check "
                        "(default 2 4 8 16; with --quick 2 4)")
    parser.add_argument("--mpiexec", default="mpiexec")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child process: measure this rank count
    parser.add_argument("--group-leaves", type=int, default=100,
                        help="leaves per rank of the first saves merged in groups (default 100)")
    parser.add_argument("--groups", type=int, help=argparse.SUPPRESS)  # a child process: measure_groups
    parser.add_argument("--boxes", type=int, nargs="+", help=argparse.SUPPRESS)  # a child process: box_checks
    parser.add_argument("--count-into", type=Path, help=argparse.SUPPRESS)  # an MPI child: count_collectives
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.leaves)))
        return 0
    if args.groups:
        print(json.dumps(measure_groups(args.groups, args.leaves)))
        return 0
    if args.boxes:
        print(json.dumps(box_checks(args.boxes)))
        return 0
    if args.count_into:
        count_collectives(args.count_into)
        return 0
    ranks = [2000, 8000] if args.quick else args.ranks
    print(MODEL)
    points = []
    for count in ranks:
        print(f"bench_scale: {count:,d} ranks x {args.leaves} leaves ...", flush=True)
        child = [sys.executable, __file__, "--one", str(count), "--leaves", str(args.leaves)]
        points.append(json.loads(run_child(child, timeout=1800)))
    listed = ", ".join(f"{count:,d}" for count in ranks)
    print(f"bench_scale: box checks at {listed} ranks, timed in turn ...", flush=True)
    boxes = run_child([sys.executable, __file__, "--boxes", *map(str, ranks)], timeout=1800)
    timed = {int(count): found for count, found in json.loads(boxes).items()}
    for point in points:
        point.update(timed[point["ranks"]])
    print_table(points)
    ends = [points[0], points[-1]]  # first to last: steps between neighbours are noisier
    worst = {key: exponents(ends, key)[0] for key in (f"boxes_{name}_s" for name in BOX_SHAPES)}
    failed = [f"{key} grows as ranks^{value:.2f}" for key, value in worst.items() if value > 1.5]
    grouped = []
    for count in ranks:
        print(f"bench_scale: first save merged in groups, {count:,d} ranks x {args.group_leaves} leaves ...",
              flush=True)
        child = [sys.executable, __file__, "--groups", str(count), "--leaves", str(args.group_leaves)]
        grouped.append(json.loads(run_child(child, timeout=1800)))
    print_table(grouped)
    failed += check_groups_goal(grouped, timed=not args.quick)
    # rank count -> per rank: per save and restore, calls and bytes received
    counted: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-scale-", dir=".") as scratch:
        sizes = args.mpi if args.mpi else [2, 4] if args.quick else [2, 4, 8, 16]
        for sharded in (False, True):
            failed += check_model(sizes, args.mpiexec, Path(scratch), counted, sharded)
    for failure in failed:
        print(f"bench_scale: FAILED: {failure}", file=sys.stderr)
    if not args.quick:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "scale.json").write_text(
            json.dumps(
                {"model": MODEL, "points": points, "groups": grouped, "mpi": counted, "failed": failed},
                indent=1,
            )
            + "\n"
        )
        print(f"bench_scale: wrote {out / 'scale.json'} and {plot(points, grouped, out)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
