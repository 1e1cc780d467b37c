# hpckpt: `make test` and `make demo` do all set-up themselves (see README.md).
VENV    ?= .venv
PY      := $(VENV)/bin/python
ULFM_VENV ?= .venv-ulfm
WHEELS_VENV ?= .venv-wheels
MPIEXEC ?= mpiexec
NP      ?= 4

.PHONY: install test lint docs test-unit test-install test-frameworks test-fault test-mpi test-lab test-slurm test-ulfm soak demo bench clean

install:
	HPCKPT_VENV=$(abspath $(VENV)) bash tools/install.sh
	HPCKPT_VENV=$(abspath $(VENV)) bash tools/install-dedalus.sh
	HPCKPT_ULFM_VENV=$(abspath $(ULFM_VENV)) bash tools/install-ulfm.sh
	bash tools/install-lab.sh

test: install
	$(MAKE) lint docs test-unit test-install test-frameworks test-fault test-mpi test-lab test-slurm test-ulfm

# ruff (the rule set is in pyproject.toml) over the library, the tests, perf/ and tools/;
# mypy (settings in pyproject.toml) over the library.
lint:
	$(PY) -m ruff check hpckpt tests perf tools
	$(PY) -m mypy

# The documentation with the API reference, into build/docs/html; fails on any warning (a
# broken docstring, cross-reference or link) and on a public name missing from docs/api.rst.
docs:
	PY=$(PY) bash tools/build-docs.sh

# The unit tests, then the scaling benchmark's quick mode (fails on super-linear growth, perf/bench_scale.py).
test-unit:
	$(PY) -m pytest tests/unit tests/gpu -q -rs
	$(PY) perf/bench_scale.py --quick --mpiexec $(MPIEXEC)

# Install path 1 (docs/install.md): a fresh environment from PyPI's wheels only, where a
# killed job resumes on hdf5 and posix and the adios2 backend refuses, naming the fix.
test-install:
	$(PY) -m pytest tests/install -q -rs

# The framework how-to (docs/frameworks.md): Dedalus's Rayleigh-Benard example killed and
# resumed bit for bit, and restored on another rank count.
test-frameworks:
	$(PY) -m pytest tests/frameworks -q -rs

test-fault:
	$(PY) -m pytest tests/fault -q

# The multi-node lab: simulated nodes (namespaces) with per-node file-system caches, and the
# same trials on a real MooseFS that the tests start (docs/lab.md).
test-lab:
	$(PY) -m pytest tests/lab -q -rs -p no:cacheprovider --timeout 170

# Long seeded repetitions, not part of `make test`: HPCKPT_LAB_SOAK power-loss trials in the
# lab and the whole power-loss matrix on MooseFS (make test: a third of it), the seeded kill
# trials of tests/fault HPCKPT_FAULT_SOAK times over, then the frozen storage trials of the
# lab with a freeze of HPCKPT_LAB_FREEZE seconds (make test: 10).
soak: install
	HPCKPT_LAB_SOAK=$${HPCKPT_LAB_SOAK:-40} $(PY) -m pytest tests/lab/test_power_loss.py -q -rs -p no:cacheprovider --timeout 170 -k "soak or moosefs"
	HPCKPT_FAULT_SOAK=$${HPCKPT_FAULT_SOAK:-5} $(PY) -m pytest tests/fault/test_heat_faults.py tests/fault/test_uncoordinated.py tests/fault/test_train.py -q -k "random"
	HPCKPT_LAB_FREEZE=$${HPCKPT_LAB_FREEZE:-60} $(PY) -m pytest tests/lab/test_storage_faults.py -q -rs -p no:cacheprovider --timeout 300 -k "frozen_storage_under_warn"

# In-job recovery: real `mpiexec --with-ft ulfm` jobs in the ULFM environment (Open MPI 5);
# they skip, saying why, where tools/install-ulfm.sh could not build it (a failure in CI:
# HPCKPT_REQUIRE_ALL=1 makes every skip but the GPU tests' a failure, tests/conftest.py).
test-ulfm:
	@if [ -x $(ULFM_VENV)/bin/python ]; then \
	  timeout 600 $(ULFM_VENV)/bin/python -m pytest tests/ulfm -q -rs -p no:cacheprovider; \
	else echo "test-ulfm: skipped: $$(cat $(ULFM_VENV).failed 2>/dev/null || echo '$(ULFM_VENV) is not built')"; \
	  if [ "$$HPCKPT_REQUIRE_ALL" = 1 ]; then echo "test-ulfm: the ULFM environment is required (HPCKPT_REQUIRE_ALL=1)" >&2; exit 1; fi; fi

# Starts a real single-node Slurm (installing slurm-wlm and munge when missing, as root).
test-slurm:
	$(PY) -m pytest tests/slurm -q -rs

# pytest-timeout's thread method ends a rank stuck in a collective; `timeout` is the backstop.
test-mpi:
	timeout 900 $(MPIEXEC) -n $(NP) $(PY) -m pytest tests/mpi --with-mpi -q -p no:cacheprovider

# The demo needs nothing compiled: it runs in the wheels-only environment (PyPI's mpi4py,
# MPICH and h5py; tools/install-wheels.sh, seconds to a minute), not in `make install`'s.
demo:
	HPCKPT_WHEELS_VENV=$(abspath $(WHEELS_VENV)) bash tools/install-wheels.sh
	PY=$(WHEELS_VENV)/bin/python NP=$(NP) bash jobs/demo.sh

# The benchmark suite: 2 ranks, every case side by side; perf/results/suite.json and PNGs;
# a torch training state against torch.distributed.checkpoint (perf/results/torch.json);
# then how planning grows from 1k to 100k ranks (perf/results/scale.json and scale.png).
bench: install
	$(PY) perf/suite.py --ranks 2 --out perf/results --dir .bench-suite
	$(MPIEXEC) -n 2 $(PY) perf/bench_torch.py --out perf/results/torch.json --dir .bench-torch
	$(PY) perf/bench_dfs.py --out perf/results/dfs.json
	$(PY) perf/bench_scale.py --out perf/results --mpiexec $(MPIEXEC)

clean:
	rm -rf $(VENV) $(WHEELS_VENV) .pytest_cache build *.egg-info
