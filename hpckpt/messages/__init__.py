"""Sender-based message logging for the uncoordinated protocol."""
