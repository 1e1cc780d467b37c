"""Damage every byte of a small step and restore it after each damage.

``python -m tests.jobs.corrupt_steps save BACKEND DIR`` saves step 1 and step 2 of a
known state; ``python -m tests.jobs.corrupt_steps check BACKEND DIR REPORT STRIDE
PART/PARTS`` (one process) copies DIR to ``REPORT.run`` and then, one damage at a time,
flips a byte of one of step 2's files (every byte outside the arrays' data, every ``STRIDE``-th
byte inside it; with compression every byte) or cuts a file at one of many lengths,
restores a fresh state with a new Checkpointer and verifies step 2 with a
CheckpointReader, then undoes the damage. It checks every PARTS-th damage from the
PART-th (0-based), so PARTS processes share the work.

Each damage must end in exactly one of two ways:

- ``harmless``: restore returns step 2 with every byte of state 2 and verify finds
  nothing (the byte was not one any reader uses);
- ``detected``: restore falls back to step 1, with a CheckpointFallbackWarning naming
  step 2, and returns every byte of state 1; verify reports step 2 damaged.

Anything else is written to the report as a failure. A damage that hangs or crashes
the process ends it: the damage being checked is always in ``REPORT.current``. The
report (JSON) also has the counts, the slowest check and the largest growth of peak
memory (VmHWM) a check caused.
"""

from __future__ import annotations

import faulthandler
import json
import os
import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from tests.helpers import BACKEND_VARIANTS
from tests.memory import peak_rss_kib, reset_peak_rss

CHECK_SECONDS = 20  # a check that takes longer is a hang: faulthandler ends the process
_MASKS = (0x01, 0x80, 0xFF, 0x10, 0x04, 0x40, 0x02, 0x20, 0x08)  # the byte is XORed with one, by position


def state_of(value: float) -> dict[str, Any]:
    """The saved state: a distributed field, a Local array, a table and plain values."""
    import hpckpt

    field = np.arange(40, dtype=np.float64).reshape(8, 5) * value
    return {
        "field": hpckpt.Distributed(field, global_shape=(8, 5), offset=(0, 0)),
        "counts": hpckpt.Local(np.arange(6, dtype=np.int32) + int(value)),
        "table": hpckpt.Replicated(np.linspace(0.0, value, 3, dtype=np.float32)),
        "iteration": int(value) * 10,
        "time": value / 7,
    }


def matches(state: dict[str, Any], value: float) -> bool:
    """Whether ``state`` holds exactly every byte of ``state_of(value)``."""
    expected = state_of(value)
    arrays = all(
        np.asarray(state[key].array).tobytes() == np.asarray(expected[key].array).tobytes()
        and np.asarray(state[key].array).dtype == np.asarray(expected[key].array).dtype
        for key in ("field", "counts", "table")
    )
    return arrays and state["iteration"] == expected["iteration"] and state["time"] == expected["time"]


def data_ranges(step_dir: Path, arrays: list[bytes]) -> dict[str, list[tuple[int, int]]]:
    """Where the saved arrays' bytes lie in each file (name -> [(start, stop)]), found by
    their contents: every flip there changes restored data and must be detected."""
    ranges: dict[str, list[tuple[int, int]]] = {}
    for path in step_dir.rglob("*"):
        if path.is_file() and path.name != "manifest.json":
            content = path.read_bytes()
            for array in arrays:
                start = content.find(array)
                while start >= 0:
                    ranges.setdefault(str(path.relative_to(step_dir)), []).append((start, start + len(array)))
                    start = content.find(array, start + 1)
    return ranges


def damages(step_dir: Path, ranges: dict[str, list[tuple[int, int]]], stride: int) -> list[dict[str, Any]]:
    """Every damage to check: flips (outside the data: every byte) and cuts of every file."""
    found = []
    for path in sorted(p for p in step_dir.rglob("*") if p.is_file()):
        name = str(path.relative_to(step_dir))
        size = path.stat().st_size
        inside = np.zeros(size, dtype=bool)
        for start, stop in ranges.get(name, []):
            inside[start:stop] = True
        for offset in range(size):
            if not inside[offset] or offset % stride == 0:
                found.append({"file": name, "kind": "flip", "at": offset, "data": bool(inside[offset])})
        for length in sorted({0, 1, size - 1, *range(0, size, max(1, size // 61))} - {size}):
            found.append({"file": name, "kind": "cut", "at": length, "data": False})
    return found


class Damage:
    """Apply one damage to a file and undo it (the file's bytes are kept meanwhile)."""

    def __init__(self, path: Path, damage: dict[str, Any]) -> None:
        self.path, self.damage = path, damage
        self.original = path.read_bytes()

    def __enter__(self) -> None:
        at = self.damage["at"]
        if self.damage["kind"] == "flip":
            mask = _MASKS[at % len(_MASKS)]
            with open(self.path, "r+b") as file:
                file.seek(at)
                file.write(bytes([self.original[at] ^ mask]))
        else:
            os.truncate(self.path, at)

    def __exit__(self, *exc: object) -> None:
        self.path.write_bytes(self.original)


def check(run_dir: Path, options: dict[str, Any]) -> tuple[str, str]:
    """Restore a fresh state and verify step 2: (outcome, what happened)."""
    import hpckpt

    state = state_of(0.0)
    state["counts"] = hpckpt.Local(np.zeros(6, dtype=np.int32))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with hpckpt.Checkpointer(run_dir, **options) as checkpointer:
            step = checkpointer.restore(state)
    fallbacks = [str(w.message) for w in caught if issubclass(w.category, hpckpt.CheckpointFallbackWarning)]
    try:
        findings = [f.message for f in hpckpt.CheckpointReader(run_dir).verify(2)]
    except hpckpt.CorruptCheckpointError as exc:
        findings = [str(exc)]
    if step == 2 and matches(state, 2.0) and not fallbacks and not findings:
        return "harmless", ""
    named = (
        len(fallbacks) == 1
        and fallbacks[0].startswith("checkpoint step 2 ")
        and "step-00000002" in fallbacks[0]
    )
    if step == 1 and matches(state, 1.0) and named and findings:
        return "detected", fallbacks[0]
    data = "state 2" if matches(state, 2.0) else "state 1" if matches(state, 1.0) else "other data"
    return "failure", f"restored step {step} ({data}); warnings {fallbacks}; verify found {findings[:1]}"


def save(name: str, run_dir: Path) -> None:
    """Save step 1 and step 2 of the known state into ``run_dir``."""
    import hpckpt

    with hpckpt.Checkpointer(run_dir, **BACKEND_VARIANTS[name]) as checkpointer:
        checkpointer.save(1, state_of(1.0))
        checkpointer.save(2, state_of(2.0))


def main() -> None:
    if sys.argv[1] == "save":
        save(sys.argv[2], Path(sys.argv[3]))
        return
    name, saved, report_path = sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
    stride = int(sys.argv[5])
    part, parts = (int(number) for number in sys.argv[6].split("/"))
    options = BACKEND_VARIANTS[name]
    run_dir = Path(str(report_path) + ".run")  # this process's copy: it damages its files
    shutil.copytree(saved, run_dir)
    step_dir = run_dir / "step-00000002"
    saved_state = state_of(2.0)
    arrays = (
        []
        if "backend_options" in options
        else [saved_state[key].array.tobytes() for key in ("field", "counts", "table")]
    )
    ranges = data_ranges(step_dir, arrays)
    todo = damages(step_dir, ranges, stride)[part::parts]
    current = Path(str(report_path) + ".current")
    counts: dict[str, int] = {}
    failures: list[dict[str, Any]] = []
    slowest, largest = (0.0, None), (0, None)
    check(run_dir, options)  # the first restore imports and initialises what later ones reuse
    baseline = peak_rss_kib()
    started = time.monotonic()
    for damage in todo:
        current.write_text(json.dumps(damage))
        with Damage(step_dir / damage["file"], damage):
            reset_peak_rss()
            faulthandler.dump_traceback_later(CHECK_SECONDS, exit=True)
            begun = time.monotonic()
            try:
                outcome, what = check(run_dir, options)
            except Exception as exc:  # noqa: BLE001 - every escape is a failure to report
                outcome, what = "failure", f"{type(exc).__name__}: {exc}"
            took = time.monotonic() - begun
            faulthandler.cancel_dump_traceback_later()
            grown = peak_rss_kib() - baseline
        if damage["data"] and outcome == "harmless":
            outcome, what = "failure", "a flipped data byte was restored unnoticed"
        key = f"{damage['kind']} {'data' if damage['data'] else 'metadata'} {outcome}"
        counts[key] = counts.get(key, 0) + 1
        if outcome == "failure":
            failures.append({**damage, "what": what})
        slowest = max(slowest, (took, damage), key=lambda pair: pair[0])
        largest = max(largest, (grown, damage), key=lambda pair: pair[0])
    current.unlink()
    files = {
        name: {
            "bytes": (step_dir / name).stat().st_size,
            "data_bytes": sum(b - a for a, b in spans),
            "flips": sum(d["kind"] == "flip" for d in todo if d["file"] == name),
            "cuts": sum(d["kind"] == "cut" for d in todo if d["file"] == name),
        }
        for name, spans in (
            (str(p.relative_to(step_dir)), ranges.get(str(p.relative_to(step_dir)), []))
            for p in step_dir.rglob("*")
            if p.is_file()
        )
    }
    report = {
        "backend": name,
        "files": files,
        "checks": len(todo),
        "counts": counts,
        "failures": failures,
        "seconds": time.monotonic() - started,
        "slowest_check": slowest,
        "largest_peak_growth_kib": largest,
    }
    report_path.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
