"""The stand-in GPU (tests/fakegpu) as pytest fixtures, for machines without a GPU.

``cupy`` makes the stand-in importable as ``cupy``/``cupyx`` for one test only, with
4 KiB chunks so that every device leaf takes several. Where real CuPy is installed the
tests that use it skip: tests/gpu covers device arrays there.
"""

import importlib
import sys
from pathlib import Path

import pytest

from hpckpt.buffers import device as device_module

FAKE_ROOT = str(Path(__file__).resolve().parent / "fakegpu")
CHUNK = 4096


def real_cupy_installed() -> bool:
    try:
        importlib.import_module("cupy")
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module")
def fake_modules():
    if real_cupy_installed():
        pytest.skip("real CuPy is installed: tests/gpu covers device arrays")
    sys.path.insert(0, FAKE_ROOT)
    try:
        modules = importlib.import_module("cupy"), importlib.import_module("cupyx")
    finally:
        sys.path.remove(FAKE_ROOT)
        sys.modules.pop("cupy", None)
        sys.modules.pop("cupyx", None)
    return modules


@pytest.fixture
def cupy(fake_modules, monkeypatch):
    """The stand-in CuPy, importable for this test only; small chunks so leaves take many."""
    fake_cupy, fake_cupyx = fake_modules
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    monkeypatch.setitem(sys.modules, "cupyx", fake_cupyx)
    monkeypatch.setattr(device_module, "CHUNK_BYTES", CHUNK)
    fake_cupy.LOG.clear()
    return fake_cupy
