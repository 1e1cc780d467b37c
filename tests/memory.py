"""This process's resident memory, read from the kernel: what a test measures, not estimates."""

from __future__ import annotations

from pathlib import Path


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def peak_rss_kib() -> int:
    """VmHWM of this process: the most resident memory since the last :func:`reset_peak_rss`."""
    return _status_kib("VmHWM")


def rss_kib() -> int:
    """VmRSS of this process: its resident memory now."""
    return _status_kib("VmRSS")


def reset_peak_rss() -> None:
    """Make VmHWM start again from the resident memory now (Linux ``clear_refs``)."""
    Path("/proc/self/clear_refs").write_text("5")
