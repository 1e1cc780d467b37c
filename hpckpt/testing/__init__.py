"""Helpers for testing codes that use hpckpt: fault injection at named points
(:mod:`hpckpt.testing.faults`) and the conformance suite of storage backends
(:mod:`hpckpt.testing.conformance`, which needs pytest; neither is imported here).
"""
