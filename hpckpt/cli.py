"""The ``hpckpt`` command line (also ``python -m hpckpt``).

Every subcommand is serial and never needs ``mpiexec``: ``run`` relaunches a job;
``ls``, ``inspect``, ``verify``, ``convert`` and ``gc`` work on a run directory.
Exit status: 0 on success, 1 when ``verify`` finds a bad block, 2 on bad usage or a
directory or step that cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from .errors import HpckptError, MissingStepError
from .model.tree import nest
from .relaunch import LAUNCHERS, launched, run_with_relaunch
from .storage import backend_names
from .storage.integrity import damaged_files
from .storage.names import TRANSIENT_SUFFIXES
from .storage.retention import KeepNewest, retain


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(prog="hpckpt", description="Checkpoint/restart for MPI jobs.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser(
        "run",
        help="run a command, relaunching it after a failure",
        description="Run COMMAND; after a non-zero exit run it again until it succeeds or the "
        "restart budget is spent. Exports HPCKPT_ATTEMPT=0,1,... and exits with the last status. "
        "Exit status 75 means the command stopped with a checkpoint (hpckpt.slurm): it is not relaunched.",
    )
    run.add_argument("--max-restarts", type=_non_negative_int, default=3, help="relaunches after the first attempt (default 3)")
    run.add_argument("--delay", type=_non_negative_float, default=1.0, help="seconds to wait before a relaunch (default 1)")
    run.add_argument(
        "--requeue",
        action="store_true",
        help="inside a Slurm job: when COMMAND stops with a checkpoint (exit status 75), scontrol requeue the job",
    )
    run.add_argument("--launch", choices=LAUNCHERS, help="start COMMAND on the ranks: srun (srun --mpi=pmi2 "
                     "--kill-on-bad-exit=1 COMMAND), or mpiexec/mpirun -n RANKS COMMAND (default: run COMMAND as given)")
    run.add_argument("--ranks", type=_positive_int, help="ranks for --launch (default: $SLURM_NTASKS inside a Slurm "
                     "job; srun's own default otherwise)")
    run.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the command, after --")
    run.set_defaults(handler=_run, subparser=run)

    listing = commands.add_parser("ls", help="list the steps of a run directory", description="List every step "
                                  "directory with its status (committed, incomplete, corrupt), size, commit time, "
                                  "backend, protocol and number of ranks.")
    listing.add_argument("directory")
    listing.add_argument("--verify", action="store_true", help="also recompute every checksum of each committed step "
                         "(a step whose data is damaged is then listed as corrupt; exit 1 if any is)")
    listing.add_argument("--json", action="store_true", help="print JSON for scripts")
    listing.set_defaults(handler=_ls)

    for name, handler, summary, description in (
        ("inspect", _inspect, "show the state tree of a step", "Show a step's leaves with their kinds, dtypes, "
         "shapes and each rank's box, and its plain values. Exit 1, naming the file, when a file of the step "
         "is missing or not of its committed size (the step cannot be restored)."),
        ("verify", _verify, "recompute every checksum of a step", "Check the step's file sizes and recompute every "
         "block's checksum. Exit 0 when all match; 1, naming the first bad leaf, rank and file, when not."),
    ):  # fmt: skip
        step_command = commands.add_parser(name, help=summary, description=description)
        step_command.add_argument("directory")
        chosen = step_command.add_mutually_exclusive_group() if name == "verify" else step_command
        chosen.add_argument("--step", type=_non_negative_int, help="the step (default: the newest committed)")
        if name == "verify":
            chosen.add_argument("--all", action="store_true", help="every committed step, oldest first; exit 1 if "
                                "any is bad")
        step_command.add_argument("--json", action="store_true", help="print JSON for scripts")
        step_command.set_defaults(handler=handler)

    convert = commands.add_parser("convert", help="rewrite checkpoints with another backend, or to/from safetensors",
                                  description="Rewrite the committed steps of SRC into the run directory DST with "
                                  "another backend; the result verifies and restores like the original. --to "
                                  "safetensors writes one step (default: the newest) to the file DST; a SRC file "
                                  "ending in .safetensors becomes a step of DST (every tensor a Replicated leaf).")
    convert.add_argument("source", metavar="SRC")
    convert.add_argument("destination", metavar="DST")
    convert.add_argument("--to", choices=(*backend_names(), "safetensors"), required=True,
                         help="the backend to write, or safetensors")  # fmt: skip
    convert.add_argument("--step", type=_non_negative_int, help="convert only this step (default: every committed one; "
                         "to safetensors, the newest; from safetensors, the file's own step or 0)")
    convert.set_defaults(handler=_convert)

    diff = commands.add_parser("diff", help="compare two checkpoints bit for bit", description="Compare a step of "
                               "run directory A with a step of B, every array leaf bit for bit and every plain value "
                               "(by block checksums where both hold the same blocks, else by reading both). Exit 0 "
                               "when they are the same, 1 naming what differs. Run a job twice, or once through a "
                               "kill and a relaunch, and diff the same step of both to check that it is "
                               "deterministic (docs/determinism.md).")
    diff.add_argument("first", metavar="A")
    diff.add_argument("second", metavar="B")
    diff.add_argument("--step", type=_non_negative_int, help="the step of both (default: the newest committed "
                      "step that both have)")
    diff.add_argument("--json", action="store_true", help="print JSON for scripts")
    diff.set_defaults(handler=_diff)

    gc = commands.add_parser("gc", help="remove incomplete steps and old ones", description="Delete leftovers of "
                             "crashed or interrupted saves (*.tmp, *.deleting, *.replaced) and all but the newest "
                             "KEEP committed steps. It takes the directory's lock first and refuses, naming the holder, "
                             "while a job has it open.")
    gc.add_argument("directory")
    gc.add_argument("--keep", type=_positive_int, required=True, help="committed steps to keep (>= 1)")
    gc.add_argument("--force", action="store_true", help="delete even while another process holds the lock "
                    "(only when that job is known to be gone, e.g. a hung node whose lock outlives it)")
    gc.set_defaults(handler=_gc)
    return parser


def _run(args: argparse.Namespace) -> int:
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not command:
        args.subparser.error("give the command after --, e.g. hpckpt run -- mpiexec -n 4 python app.py")
    if args.launch is not None:
        try:
            command = launched(args.launch, args.ranks, command)
        except ValueError as exc:
            args.subparser.error(str(exc))
    return run_with_relaunch(command, max_restarts=args.max_restarts, delay=args.delay, requeue=args.requeue)


def _reader(directory: str) -> Any:
    from .catalog import CheckpointReader

    return CheckpointReader(directory)


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def _ls(args: argparse.Namespace) -> int:
    from .progress import human_bytes

    reader = _reader(args.directory)
    rows = []
    for entry in reader.entries():
        manifest = entry.manifest
        status, problem = entry.status, entry.problem
        if args.verify and status == "committed":
            findings = _verified(reader, manifest)
            status, problem = ("corrupt", findings[0].message) if findings else ("verified", None)
        rows.append({
            "step": entry.step,
            "status": status,
            "path": str(entry.path),
            "bytes": entry.bytes,
            "committed": manifest.committed if manifest else None,
            "backend": manifest.backend if manifest else None,
            "protocol": manifest.protocol if manifest else None,
            "world_size": manifest.world_size if manifest else None,
            "problem": problem,
        })  # fmt: skip
    damaged = args.verify and any(row["status"] == "corrupt" for row in rows)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 1 if damaged else 0
    print(f"{'STEP':>10}  {'STATUS':<10}  {'SIZE':>10}  {'COMMITTED':<19}  {'BACKEND':<7}  {'PROTOCOL':<13}  RANKS")
    for row in rows:
        committed = _when(row["committed"]) if row["committed"] else "-"
        print(
            f"{row['step']:>10}  {row['status']:<10}  {human_bytes(row['bytes']):>10}  {committed:<19}  "
            f"{row['backend'] or '-':<7}  {row['protocol'] or '-':<13}  {row['world_size'] or '-'}"
        )
        if row["problem"]:
            print(f"{'':>10}  {row['problem']}")
    return 1 if damaged else 0


def _verified(reader: Any, manifest: Any) -> list[Any]:
    """The findings of recomputing every checksum of ``manifest``'s step, with a progress line on a terminal."""
    from .progress import ProgressLine

    progress = ProgressLine(f"verify step {manifest.step}", sum(record.nbytes for record in manifest.leaves))
    try:
        return reader.verify(manifest.step, progress)
    finally:
        progress.close()


def _box(offset: Sequence[int], shape: Sequence[int]) -> str:
    return "[" + ", ".join(f"{o}:{o + n}" for o, n in zip(offset, shape)) + "]"


def _inspect(args: argparse.Namespace) -> int:
    import numpy as np

    from .model.delta import home_step, referenced_steps
    from .model.reads import is_member
    from .progress import human_bytes
    from .storage.codec import LOSSY_CODEC

    reader = _reader(args.directory)
    manifest = reader.manifest(args.step)
    damaged = damaged_files(reader.run_dir, manifest)
    leaves = []
    for record in manifest.tree_leaves:
        leaves.append({
            "path": record.path,
            "kind": record.kind,
            "dtype": str(np.dtype(record.dtype)),
            "shape": list(record.global_shape) if record.global_shape is not None else None,
            "blocks": [
                {
                    "rank": b.rank, "offset": list(b.offset), "shape": list(b.shape),
                    "in_step": home_step(b, manifest.step), "codec": b.location.get("codec"),
                    "packed": is_member(b),
                }
                for b in record.blocks
            ],
            "location": record.location,
            "encoding": record.encoding,
        })  # fmt: skip
    tree = nest({**manifest.values, **{leaf["path"]: _ArrayLeaf(leaf) for leaf in leaves}}, manifest.lists)
    summary = {
        "step": manifest.step,
        "backend": manifest.backend,
        "protocol": manifest.protocol,
        "world_size": manifest.world_size,
        "committed": manifest.committed,
        "checksum_algorithm": manifest.checksum_algorithm,
        "delta_base": manifest.delta_base,
        "leaves": leaves,
        "values": manifest.values,
        "tree": tree,
        "damaged": damaged,
    }
    if args.json:
        print(json.dumps(summary, indent=1, default=repr))
        return 1 if damaged else 0
    total = sum(record.nbytes for record in manifest.leaves)
    print(
        f"step {manifest.step}: backend {manifest.backend}, protocol {manifest.protocol}, "
        f"{manifest.world_size} ranks, committed {_when(manifest.committed)}, {human_bytes(total)} of arrays"
    )
    if manifest.incremental:
        reused = sum(
            b.size * r.itemsize for r in manifest.leaves for b in r.blocks if home_step(b, manifest.step) != manifest.step
        )
        print(f"  incremental over step {manifest.delta_base}: {human_bytes(reused)} of blocks are read from earlier "
              f"steps {sorted(referenced_steps(manifest))}")
    for leaf in leaves:
        shape = tuple(leaf["shape"]) if leaf["shape"] is not None else "per rank"
        if leaf["encoding"] == "pickle":
            print(f"  {leaf['path']}: {leaf['kind']} pickled object (bytes shown, never unpickled here)")
        elif leaf["encoding"] == "bfloat16":
            print(f"  {leaf['path']}: {leaf['kind']} bfloat16 (stored as {leaf['dtype']} bits) {shape}")
        else:
            print(f"  {leaf['path']}: {leaf['kind']} {leaf['dtype']} {shape}")
        for block in leaf["blocks"]:
            where = _box(block["offset"], block["shape"]) if leaf["kind"] == "distributed" else tuple(block["shape"])
            home = f" (in step {block['in_step']})" if block["in_step"] != manifest.step else ""
            codec = f" [{block['codec']}{', lossy' if block['codec'] == LOSSY_CODEC else ''}]" if block["codec"] else ""
            packed = " (packed)" if block["packed"] else ""
            print(f"      rank {block['rank']}: {where}{home}{codec}{packed}")
    for key, entry in (tree.items() if isinstance(tree, dict) else enumerate(tree)):
        if _holds_values(entry):  # nested as saved, with its array leaves named
            print(f"  {key}: value {entry!r}")
    for problem in damaged:
        print(f"hpckpt inspect: step {manifest.step} cannot be restored: {problem}", file=sys.stderr)
    return 1 if damaged else 0


class _ArrayLeaf:
    """An array leaf where it stands in a tree of plain values, shown as ``<kind dtype shape>``."""

    def __init__(self, leaf: dict[str, Any]) -> None:
        shape = tuple(leaf["shape"]) if leaf["shape"] is not None else "per rank"
        self.text = f"<{leaf['kind']} {leaf['dtype']} {shape}>"

    def __repr__(self) -> str:
        return self.text


def _holds_values(entry: Any) -> bool:
    """True when ``entry`` is a plain value or a container with one somewhere inside."""
    if isinstance(entry, dict):
        return any(_holds_values(value) for value in entry.values())
    if isinstance(entry, list):
        return any(_holds_values(value) for value in entry)
    return not isinstance(entry, _ArrayLeaf)


def _verify(args: argparse.Namespace) -> int:
    reader = _reader(args.directory)
    manifests = [reader.manifest(step) for step in reader.steps()] if args.all else [reader.manifest(args.step)]
    if not manifests:
        raise MissingStepError(f"{reader.run_dir.root} holds no committed step to verify")
    results = []
    for manifest in manifests:
        step = manifest.step
        findings = _verified(reader, manifest)
        blocks = sum(len(record.blocks) for record in manifest.leaves)
        total = sum(record.nbytes for record in manifest.leaves)
        results.append({"step": step, "ok": not findings, "blocks": blocks, "bytes": total,
                        "findings": [vars(finding) for finding in findings]})  # fmt: skip
        if args.json:
            continue
        if findings:
            print(f"step {step}: BAD: {findings[0].message}")
            if len(findings) > 1:
                print(f"step {step}: and {len(findings) - 1} more bad block(s) or file(s)")
        else:
            print(f"step {step}: OK: {blocks} blocks, {total} bytes, every {manifest.checksum_algorithm} checksum matches")
    bad = [result["step"] for result in results if not result["ok"]]
    if args.json:
        print(json.dumps(results if args.all else results[0], indent=1))
    elif args.all:
        print(f"{len(manifests) - len(bad)} of {len(manifests)} committed step(s) OK" + (f"; bad: {bad}" if bad else ""))
    return 1 if bad else 0


def _convert(args: argparse.Namespace) -> int:
    from .convert import convert_step
    from .progress import ProgressLine
    from .safetensors_io import export_step, import_file

    if args.source.endswith(".safetensors"):
        if args.to == "safetensors":
            raise HpckptError("both SRC and --to are safetensors: give a backend to import into")
        step = import_file(args.source, args.destination, step=args.step, backend=args.to)
        print(f"{args.source} -> step {step} of {args.destination} ({args.to})")
        return 0
    reader = _reader(args.source)
    if args.to == "safetensors":
        manifest = reader.manifest(args.step)
        progress = ProgressLine(f"export step {manifest.step}", sum(record.nbytes for record in manifest.tree_leaves))
        path = export_step(reader, manifest.step, args.destination, progress)
        progress.close()
        print(f"step {manifest.step}: {manifest.backend} -> safetensors: {path}")
        return 0
    steps = [args.step] if args.step is not None else reader.steps()
    if not steps:
        raise HpckptError(f"{args.source} holds no committed step to convert")
    for step in steps:
        manifest = reader.manifest(step)
        progress = ProgressLine(f"convert step {step}", sum(record.nbytes for record in manifest.leaves))
        path = convert_step(reader, step, args.destination, args.to, progress=progress)
        progress.close()
        print(f"step {step}: {manifest.backend} -> {args.to}: {path}")
    return 0


def _diff(args: argparse.Namespace) -> int:
    from .compare import differences

    first, second = _reader(args.first), _reader(args.second)
    step = args.step
    if step is None:
        common = sorted(set(first.steps()) & set(second.steps()))
        if not common:
            raise MissingStepError(f"{args.first} (steps {first.steps()}) and {args.second} (steps {second.steps()}) "
                                   "have no committed step in common; give --step")
        step = common[-1]
    found = differences(first, step, second, step)
    if args.json:
        print(json.dumps({"step": step, "same": not found, "differences": found}, indent=1))
    elif found:
        print(f"step {step}: DIFFERENT: {len(found)} difference(s)")
        for line in found:
            print(f"  {line}")
    else:
        manifest = first.manifest(step)
        print(f"step {step}: SAME: {len(manifest.tree_leaves)} array leaves and {len(manifest.values)} plain values "
              "bit for bit")
    return 1 if found else 0


def _gc(args: argparse.Namespace) -> int:
    from .errors import InvalidStateError
    from .storage.lock import RunLock

    reader = _reader(args.directory)
    lock = RunLock(reader.run_dir.root)
    try:
        lock.acquire()
    except InvalidStateError as exc:
        if not args.force:
            raise InvalidStateError(f"{exc.args[0]}; not deleting anything (--force deletes anyway)") from None
        print(f"hpckpt gc: warning: {exc.args[0]}; deleting anyway (--force)", file=sys.stderr)
    try:
        leftovers = [entry for entry in reader.entries() if entry.path.suffix in TRANSIENT_SUFFIXES]
        deleted = retain(reader.run_dir, (KeepNewest(args.keep),))
    finally:
        lock.release()
    for entry in leftovers:
        print(f"removed incomplete {entry.path}")
    for step in deleted:
        print(f"removed step {step}")
    print(f"kept {len(reader.steps())} committed step(s)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``hpckpt`` command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except (HpckptError, OSError, KeyError, ValueError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"hpckpt {args.command}: error: {message}", file=sys.stderr)
        return 2
