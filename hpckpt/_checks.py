"""Checks of option values, shared by every layer (imports nothing of hpckpt)."""

from __future__ import annotations

from typing import Any


def is_count(value: Any, minimum: int = 0) -> bool:
    """Whether ``value`` is an integer (a bool is not) of at least ``minimum``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def require_count(value: Any, name: str, minimum: int = 0, *, meaning: str = "") -> int:
    """``value`` if :func:`is_count`, else ValueError: "NAME must be an integer >= MINIMUM
    (MEANING), got VALUE".
    """
    if not is_count(value, minimum):
        explained = f" ({meaning})" if meaning else ""
        raise ValueError(f"{name} must be an integer >= {minimum}{explained}, got {value!r}")
    return int(value)
