"""Helpers for testing codes that use hpckpt: fault injection at named points."""
