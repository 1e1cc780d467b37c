"""Runnable scientific codes that use hpckpt (``python -m hpckpt.examples.heat``)."""
