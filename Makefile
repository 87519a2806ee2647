# `make demo` and `make test` create .venv on first use.
PY := .venv/bin/python
VENV_STAMP := .venv/.installed
WORKDIR ?= workdir/demo

.PHONY: demo test bench clean

$(VENV_STAMP): setup.py
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	# rapidocr pulls opencv-python-headless, whose cv2 would shadow the contrib build (SIFT, dnn_superres).
	$(PY) -m pip install -q --force-reinstall --no-deps opencv-contrib-python-headless==5.0.0.93
	touch $(VENV_STAMP)

demo: $(VENV_STAMP)
	$(PY) -m osvl_jax.demo --workdir=$(WORKDIR)

# Two phases: the test files on 2 xdist workers, then tests/distributed alone (each of its tests starts several
# JAX processes; beside two ~8 GB workers they would exceed a 24 GB machine).
test: $(VENV_STAMP)
	XLA_FLAGS=--xla_force_host_platform_device_count=8 $(PY) -m pytest -q -n 2 --dist loadfile tests \
	    --ignore=tests/distributed
	XLA_FLAGS=--xla_force_host_platform_device_count=8 $(PY) -m pytest -q tests/distributed

clean:
	rm -rf workdir .pytest_cache
