"""Checkpoint protocols: when ranks take a consistent cut (no byte layout here)."""

PROTOCOLS = ("coordinated", "uncoordinated")
